#include "model/attention_part.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "model/gqa_attention.h"
#include "model/router.h"

namespace afd {

using kernels::ActPrecision;

namespace {

void add_bias(const Vector& b, float* y, int64_t n) {
  if (b.empty()) return;
  for (int64_t i = 0; i < n; ++i) kernels::axpy(1.0f, b.data, b.n, y + i * b.n);
}

}  // namespace

AttentionPart::AttentionPart(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv, AttentionOptions opt,
                             ThreadPool* pool)
    : w_(std::move(w)), kv_(kv), opt_(opt), pool_(pool) {}

void AttentionPart::embed(TokenBatch& b) const {
  const int64_t hid = config().hidden_size;
  for (int64_t i = 0; i < b.n; ++i) matrix_row_f32(w_->embed, b.tokens[i], &b.x[i * hid]);
}

void AttentionPart::forward(int64_t layer, TokenBatch& b) {
  const ModelConfig& c = config();
  const LayerWeights& L = w_->layers[layer];
  const int64_t n = b.n, hid = c.hidden_size, hd = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);

  kernels::rmsnorm(b.x.data(), L.input_norm.data, n, hid, eps, b.hn.data());
  linear(L.attn.q, b.hn.data(), n, b.q.data(), opt_.prec, pool_);
  linear(L.attn.k, b.hn.data(), n, b.k.data(), opt_.prec, pool_);
  linear(L.attn.v, b.hn.data(), n, b.v.data(), opt_.prec, pool_);
  add_bias(L.attn.q_bias, b.q.data(), n);
  add_bias(L.attn.k_bias, b.k.data(), n);
  add_bias(L.attn.v_bias, b.v.data(), n);
  if (c.qk_norm) {
    kernels::rmsnorm(b.q.data(), L.attn.q_norm.data, n * c.n_heads, hd, eps, b.q.data());
    kernels::rmsnorm(b.k.data(), L.attn.k_norm.data, n * c.n_kv_heads, hd, eps, b.k.data());
  }
  for (int64_t i = 0; i < n; ++i) {
    kernels::rope_neox(&b.q[i * c.q_dim()], c.n_heads, hd, b.pos[i], c.rope_theta);
    kernels::rope_neox(&b.k[i * c.kv_dim()], c.n_kv_heads, hd, b.pos[i], c.rope_theta);
    kv_->write(layer, b.seq[i], b.pos[i], &b.k[i * c.kv_dim()], &b.v[i * c.kv_dim()]);
  }
  attend(layer, b);
  // x += o_proj(attn)
  linear(L.attn.o, b.attn.data(), n, c.q_dim(), b.x.data(), hid, opt_.prec, pool_, /*accumulate=*/true);
  kernels::rmsnorm(b.x.data(), L.post_attention_norm.data, n, hid, eps, b.h.data());
  if (L.is_moe) route(layer, b);
}

void AttentionPart::attend(int64_t layer, TokenBatch& b) {
  const ModelConfig& c = config();
  GqaShape shape{c.n_heads, c.n_kv_heads, c.head_dim, c.sliding_window};
  const int64_t tasks = b.n * c.n_kv_heads;
  pool_->run(static_cast<int>(tasks), [&](int task, int) {
    const int64_t i = task / c.n_kv_heads, g = task % c.n_kv_heads;
    gqa_attend_one(*kv_, layer, b.seq[i], b.pos[i] + 1, g, shape, &b.q[i * c.q_dim()], &b.attn[i * c.q_dim()]);
  });
}

void AttentionPart::route(int64_t layer, TokenBatch& b) {
  const MoeWeights& moe = w_->layers[layer].moe;
  // Router logits with f32 activations in both modes: a routing flip changes the output by
  // a whole expert, so the router's input is never rounded to bf16.
  linear(moe.router, b.h.data(), b.n, b.router.data(), ActPrecision::f32, pool_);
  route_tokens(config(), b.router.data(), moe.score_bias.empty() ? nullptr : moe.score_bias.data, b.n,
               b.topk_ids.data(), b.topk_w.data());
}

void AttentionPart::add_ffn(TokenBatch& b) const {
  kernels::axpy(1.0f, b.ffn_out.data(), b.n * config().hidden_size, b.x.data());
}

void AttentionPart::logits(const TokenBatch& b, std::span<const int64_t> rows, float* out) {
  const ModelConfig& c = config();
  const int64_t hid = c.hidden_size, m = static_cast<int64_t>(rows.size());
  final_scratch_.resize(static_cast<size_t>(m * hid));
  for (int64_t r = 0; r < m; ++r)
    kernels::rmsnorm(&b.x[rows[r] * hid], w_->final_norm.data, 1, hid, static_cast<float>(c.rms_norm_eps),
                     &final_scratch_[r * hid]);
  linear(w_->lm_head, final_scratch_.data(), m, out, opt_.prec, pool_);
}

}  // namespace afd
