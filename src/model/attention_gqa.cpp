// Grouped-query attention (Qwen3-MoE, Qwen2-MoE, Mixtral; Step-3 MFA) as an AttentionVariant:
//   q,k,v = proj(hn) [+bias]; with a low-rank query (q_a non-empty, Step-3 MFA)
//   q = q_proj_b(rmsnorm(q_a(hn), q_a_norm)) instead;
//   [q,k per-head rmsnorm]; rope(q,k at pos) (rotate-half over the whole head);
//   kv[l] <- k,v; out = softmax(q k^T / sqrt(hd)) v (causal, GQA, optional sliding window).
// With one K/V head and no window (MFA) the multi-query kernel computes the last step.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/cpu/mla_attention.h"
#include "model/attention_variant.h"
#include "model/gqa_attention.h"

namespace afd {

namespace {

void add_bias(const Vector& b, float* y, int64_t n) {
  if (b.empty()) return;
  for (int64_t i = 0; i < n; ++i) kernels::axpy(1.0f, b.data, b.n, y + i * b.n);
}

class GqaAttention final : public AttentionVariant {
 public:
  GqaAttention(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv, AttentionOptions opt, ThreadPool* pool)
      : w_(std::move(w)), kv_(kv), opt_(opt), pool_(pool) {}

  void attend(int64_t layer, TokenBatch& b, float* out) override {
    const ModelConfig& c = w_->config;
    const AttentionWeights& A = w_->layers[layer].attn;
    const int64_t n = b.n, hd = c.head_dim;
    const float eps = static_cast<float>(c.rms_norm_eps);
    if (!A.q_a.empty()) {
      // Low-rank query (Step-3 MFA): q = wq(rmsnorm(q_proj(hn), inter_norm)).
      const int64_t r = A.q_a.rows;
      q_low_.resize(static_cast<size_t>(n * r));
      linear(A.q_a, b.hn.data(), n, q_low_.data(), opt_.prec, pool_);
      kernels::rmsnorm(q_low_.data(), A.q_a_norm.data, n, r, eps, q_low_.data());
      linear(A.q, q_low_.data(), n, b.q.data(), opt_.prec, pool_);
    } else {
      linear(A.q, b.hn.data(), n, b.q.data(), opt_.prec, pool_);
    }
    linear(A.k, b.hn.data(), n, b.k.data(), opt_.prec, pool_);
    linear(A.v, b.hn.data(), n, b.v.data(), opt_.prec, pool_);
    add_bias(A.q_bias, b.q.data(), n);
    add_bias(A.k_bias, b.k.data(), n);
    add_bias(A.v_bias, b.v.data(), n);
    if (c.qk_norm) {
      kernels::rmsnorm(b.q.data(), A.q_norm.data, n * c.n_heads, hd, eps, b.q.data());
      kernels::rmsnorm(b.k.data(), A.k_norm.data, n * c.n_kv_heads, hd, eps, b.k.data());
    }
    for (int64_t i = 0; i < n; ++i) {
      kernels::rope_neox(&b.q[i * c.q_dim()], c.n_heads, hd, b.pos[i], c.rope_theta);
      kernels::rope_neox(&b.k[i * c.kv_dim()], c.n_kv_heads, hd, b.pos[i], c.rope_theta);
      kv_->write(layer, b.seq[i], b.pos[i], &b.k[i * c.kv_dim()], &b.v[i * c.kv_dim()]);
    }
    if (c.n_kv_heads == 1 && c.sliding_window == 0) return attend_mqa(layer, b, out);
    GqaShape shape{c.n_heads, c.n_kv_heads, c.head_dim, c.sliding_window};
    const int64_t tasks = n * c.n_kv_heads;
    pool_->run(static_cast<int>(tasks), [&](int task, int) {
      const int64_t i = task / c.n_kv_heads, g = task % c.n_kv_heads;
      gqa_attend_one(*kv_, layer, b.seq[i], b.pos[i] + 1, g, shape, &b.q[i * c.q_dim()], &out[i * c.q_dim()]);
    });
  }

 private:
  // One K/V head shared by every query head (Step-3's MFA): the multi-query kernel with the
  // heads as its vector dimension (kernels/cpu/mla_attention.h), tasks of (token, group of
  // heads) so that a small batch still occupies the pool.
  void attend_mqa(int64_t layer, TokenBatch& b, float* out) {
    const ModelConfig& c = w_->config;
    const int64_t n = b.n, N = c.n_heads, hd = c.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    rows_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows_[i].bind(*kv_, layer, b.seq[i]);
    const int64_t max_groups = (N + 31) / 32;
    const int64_t groups = std::clamp<int64_t>((pool_->size() + n - 1) / n, 1, max_groups);
    const int64_t hg = std::min<int64_t>(N, ((N + groups - 1) / groups + 31) / 32 * 32);
    const int64_t ng = (N + hg - 1) / hg;
    pool_->run(static_cast<int>(n * ng), [&](int task, int) {
      const int64_t i = task / ng, h0 = (task % ng) * hg, nh = std::min(hg, N - h0);
      kernels::mqa_decode_attend(&b.q[i * c.q_dim() + h0 * hd], hd, nh, rows_[i].k, &rows_[i].v, hd, b.pos[i] + 1,
                                 scale, &out[i * c.q_dim() + h0 * hd], hd);
    });
  }

  // K and V rows of one sequence's cache (KV head 0) as the kernel reads them.
  struct SeqRows {
    std::vector<const uint8_t*> kb, vb;
    std::vector<const float*> ks, vs;
    kernels::PagedRows k, v;
    void bind(const PagedKvCache& kv, int64_t layer, int64_t seq) {
      k = paged_rows(kv, layer, seq, 0, /*values=*/false, &kb, &ks);
      v = paged_rows(kv, layer, seq, 0, /*values=*/true, &vb, &vs);
    }
  };

 private:
  std::shared_ptr<const ModelWeights> w_;
  PagedKvCache* kv_;
  AttentionOptions opt_;
  ThreadPool* pool_;
  std::vector<float> q_low_;  // [n, q_lora_rank] low-rank query scratch
  std::vector<SeqRows> rows_;  // attend_mqa: per token of the batch
};

}  // namespace

std::unique_ptr<AttentionVariant> make_gqa_attention(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv,
                                                     AttentionOptions opt, ThreadPool* pool) {
  return std::make_unique<GqaAttention>(std::move(w), kv, opt, pool);
}

}  // namespace afd
