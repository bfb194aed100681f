#include "model/attention_part.h"

#include "core/check.h"
#include "model/router.h"

namespace afd {

using kernels::ActPrecision;

AttentionPart::AttentionPart(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv, AttentionOptions opt,
                             ThreadPool* pool)
    : w_(w),
      opt_(opt),
      pool_(pool),
      attention_(make_attention_variant(std::move(w), kv, opt, pool)),
      scratch_(pool != nullptr ? pool->size() : 1) {
  AFD_CHECK(attention_ != nullptr);
}

void AttentionPart::embed(TokenBatch& b) const {
  const int64_t hid = config().hidden_size;
  for (int64_t i = 0; i < b.n; ++i) matrix_row_f32(w_->embed, b.tokens[i], &b.x[i * hid]);
}

void AttentionPart::forward(int64_t layer, TokenBatch& b) {
  const ModelConfig& c = config();
  const LayerWeights& L = w_->layers[layer];
  const int64_t n = b.n, hid = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  kernels::rmsnorm(b.x.data(), L.input_norm.data, n, hid, eps, b.hn.data());
  attention_->attend(layer, b, b.attn.data());
  // x += o_proj(attn)
  linear(L.attn.o, b.attn.data(), n, c.o_in_dim(), b.x.data(), hid, opt_.prec, pool_, scratch_, /*accumulate=*/true,
         opt_.order());
  kernels::rmsnorm(b.x.data(), L.post_attention_norm.data, n, hid, eps, b.h.data());
  if (L.is_moe) route(layer, b);
}

void AttentionPart::route(int64_t layer, TokenBatch& b) {
  const MoeWeights& moe = w_->layers[layer].moe;
  // Router logits with f32 activations in both modes: a routing flip changes the output by
  // a whole expert, so the router's input is never rounded to bf16.
  linear(moe.router, b.h.data(), b.n, b.router.data(), ActPrecision::f32, pool_, scratch_, opt_.order());
  route_tokens(config(), b.router.data(), moe.score_bias.empty() ? nullptr : moe.score_bias.data, b.n,
               b.topk_ids.data(), b.topk_w.data());
}

void AttentionPart::add_ffn(TokenBatch& b) const {
  kernels::axpy(1.0f, b.ffn_out.data(), b.n * config().hidden_size, b.x.data());
}

void AttentionPart::final_hidden(const TokenBatch& b, std::span<const int64_t> rows, float* out) const {
  const ModelConfig& c = config();
  const int64_t hid = c.hidden_size, m = static_cast<int64_t>(rows.size());
  for (int64_t r = 0; r < m; ++r)
    kernels::rmsnorm(&b.x[rows[r] * hid], w_->final_norm.data, 1, hid, static_cast<float>(c.rms_norm_eps),
                     &out[r * hid]);
}

void AttentionPart::logits(const TokenBatch& b, std::span<const int64_t> rows, float* out) {
  const int64_t m = static_cast<int64_t>(rows.size());
  final_scratch_.resize(static_cast<size_t>(m * config().hidden_size));
  final_hidden(b, rows, final_scratch_.data());
  linear(w_->lm_head, final_scratch_.data(), m, out, opt_.prec, pool_, scratch_, opt_.order());
}

}  // namespace afd
