// Grouped-query attention (Qwen3-MoE, Qwen2-MoE, Mixtral; Step-3 MFA) as an AttentionVariant:
//   q,k,v = proj(hn) [+bias]; with a low-rank query (q_a non-empty, Step-3 MFA)
//   q = q_proj_b(rmsnorm(q_a(hn), q_a_norm)) instead;
//   [q,k per-head rmsnorm]; rope(q,k at pos) (rotate-half over the whole head);
//   kv[l] <- k,v; out = softmax(q k^T / sqrt(hd)) v (causal, GQA, optional sliding window).
#include <memory>
#include <vector>

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
    GqaShape shape{c.n_heads, c.n_kv_heads, c.head_dim, c.sliding_window};
    const int64_t tasks = n * c.n_kv_heads;
    pool_->run(static_cast<int>(tasks), [&](int task, int) {
      const int64_t i = task / c.n_kv_heads, g = task % c.n_kv_heads;
      gqa_attend_one(*kv_, layer, b.seq[i], b.pos[i] + 1, g, shape, &b.q[i * c.q_dim()], &out[i * c.q_dim()]);
    });
  }

 private:
  std::shared_ptr<const ModelWeights> w_;
  PagedKvCache* kv_;
  AttentionOptions opt_;
  ThreadPool* pool_;
  std::vector<float> q_low_;  // [n, q_lora_rank] low-rank query scratch
};

}  // namespace

std::unique_ptr<AttentionVariant> make_gqa_attention(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv,
                                                     AttentionOptions opt, ThreadPool* pool) {
  return std::make_unique<GqaAttention>(std::move(w), kv, opt, pool);
}

}  // namespace afd
