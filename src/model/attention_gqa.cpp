// Grouped-query attention (Qwen3-MoE, Qwen2-MoE, Mixtral; Step-3 MFA) as an AttentionVariant:
//   q,k,v = proj(hn) [+bias]; with a low-rank query (q_a non-empty, Step-3 MFA)
//   q = q_proj_b(rmsnorm(q_a(hn), q_a_norm)) instead;
//   [q,k per-head rmsnorm]; rope(q,k at pos) (rotate-half over the whole head);
//   kv[l] <- k,v; out = softmax(q k^T / sqrt(hd)) v (causal, GQA, optional sliding window).
// With one K/V head and no window (MFA) the multi-query kernel computes the last step; else
// runs of prompt tokens take the blocked prefill kernel (kernels/cpu/causal_attention.h) where
// it runs, and other tokens the per-token kernel (gqa_attention.h).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/cpu/causal_attention.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/rope.h"
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
      : w_(std::move(w)), kv_(kv), opt_(opt), pool_(pool), scratch_(pool->size()) {
    const ModelConfig& c = w_->config;
    inv_freq_.resize(static_cast<size_t>(c.head_dim / 2));
    kernels::rope_inv_freq(c.head_dim, c.rope_theta, 0.0, 0.0, 0.0, 0.0, inv_freq_.data());
  }

  void attend(int64_t layer, TokenBatch& b, float* out) override {
    const ModelConfig& c = w_->config;
    const AttentionWeights& A = w_->layers[layer].attn;
    const int64_t n = b.n, hd = c.head_dim;
    const float eps = static_cast<float>(c.rms_norm_eps);
    if (!A.q_a.empty()) {
      // Low-rank query (Step-3 MFA): q = wq(rmsnorm(q_proj(hn), inter_norm)).
      const int64_t r = A.q_a.rows;
      q_low_.resize(static_cast<size_t>(n * r));
      linear(A.q_a, b.hn.data(), n, q_low_.data(), opt_.prec, pool_, scratch_, opt_.order());
      kernels::rmsnorm(q_low_.data(), A.q_a_norm.data, n, r, eps, q_low_.data());
      linear(A.q, q_low_.data(), n, b.q.data(), opt_.prec, pool_, scratch_, opt_.order());
    } else {
      linear(A.q, b.hn.data(), n, b.q.data(), opt_.prec, pool_, scratch_, opt_.order());
    }
    linear(A.k, b.hn.data(), n, b.k.data(), opt_.prec, pool_, scratch_, opt_.order());
    linear(A.v, b.hn.data(), n, b.v.data(), opt_.prec, pool_, scratch_, opt_.order());
    add_bias(A.q_bias, b.q.data(), n);
    add_bias(A.k_bias, b.k.data(), n);
    add_bias(A.v_bias, b.v.data(), n);
    if (c.qk_norm) {
      kernels::rmsnorm(b.q.data(), A.q_norm.data, n * c.n_heads, hd, eps, b.q.data());
      kernels::rmsnorm(b.k.data(), A.k_norm.data, n * c.n_kv_heads, hd, eps, b.k.data());
    }
    // NEOX RoPE (the same numbers as kernels::rope_neox: cos/sin of pos * theta^(-2i/hd) in
    // double, rounded to float), one cos/sin table per token for its q and k heads; tokens
    // are independent (distinct cache slots), so many of them are split over the pool.
    auto rope_write = [&](int64_t i0, int64_t i1, int thread) {
      ScratchSlot& scratch = scratch_.slot(thread);
      ScratchSlot::Frame frame(scratch);
      float* cs = scratch.take<float>(static_cast<size_t>(hd / 2));
      float* sn = scratch.take<float>(static_cast<size_t>(hd / 2));
      for (int64_t i = i0; i < i1; ++i) {
        kernels::rope_cos_sin(b.pos[i], inv_freq_.data(), hd / 2, 1.0, cs, sn);
        kernels::rope_rotate(&b.q[i * c.q_dim()], c.n_heads, hd, hd, cs, sn, false);
        kernels::rope_rotate(&b.k[i * c.kv_dim()], c.n_kv_heads, hd, hd, cs, sn, false);
        kv_->write(layer, b.seq[i], b.pos[i], &b.k[i * c.kv_dim()], &b.v[i * c.kv_dim()]);
      }
    };
    if (n >= kMinRun * 4) pool_->parallel_for(n, rope_write);
    else rope_write(0, n, 0);
    if (c.n_kv_heads == 1 && c.sliding_window == 0) return attend_mqa(layer, b, out);
    // Runs of at least kMinRun prompt tokens (consecutive batch rows of one sequence at
    // consecutive positions) go to the blocked kernel where it runs; every other token is
    // attended on its own.
    const bool blocked = kernels::causal_attention_blocked(hd);
    singles_.clear();
    for (int64_t i = 0; i < n;) {
      int64_t e = i + 1;
      while (e < n && b.seq[e] == b.seq[i] && b.pos[e] == b.pos[e - 1] + 1) ++e;
      if (blocked && e - i >= kMinRun) {
        attend_run(layer, b, i, e - i, out);
      } else {
        for (int64_t j = i; j < e; ++j) singles_.push_back(j);
      }
      i = e;
    }
    if (singles_.empty()) return;
    GqaShape shape{c.n_heads, c.n_kv_heads, c.head_dim, c.sliding_window};
    const int64_t tasks = static_cast<int64_t>(singles_.size()) * c.n_kv_heads;
    pool_->run(static_cast<int>(tasks), [&](int task, int thread) {
      const int64_t i = singles_[task / c.n_kv_heads], g = task % c.n_kv_heads;
      gqa_attend_one(*kv_, layer, b.seq[i], b.pos[i] + 1, g, shape, &b.q[i * c.q_dim()], &out[i * c.q_dim()],
                     scratch_.slot(thread));
    });
  }

 private:
  // Shortest run of prompt tokens that takes the blocked kernel.
  static constexpr int64_t kMinRun = 8;

  // Batch rows [i0, i0 + nq) are one sequence's positions p0 .. p0 + nq - 1 (their K/V already
  // in the cache): the sequence's K and V rows 0 .. p0 + nq - 1 are read back from the cache as
  // f32 (the values the per-token path reads) and kernels::causal_attention attends the run —
  // batch-invariant, in the per-token kernel's order (CausalOrder::decode).
  void attend_run(int64_t layer, TokenBatch& b, int64_t i0, int64_t nq, float* out) {
    const ModelConfig& c = w_->config;
    const int64_t kvd = c.kv_dim(), qd = c.q_dim(), p0 = b.pos[i0], n_ctx = p0 + nq, seq = b.seq[i0];
    k_rows_.resize(static_cast<size_t>(n_ctx * kvd));
    v_rows_.resize(static_cast<size_t>(n_ctx * kvd));
    pool_->parallel_for(n_ctx, [&](int64_t j0, int64_t j1, int) {
      for (int64_t j = j0; j < j1; ++j) {
        kv_->read_k(layer, seq, j, &k_rows_[j * kvd]);
        kv_->read_v(layer, seq, j, &v_rows_[j * kvd]);
      }
    });
    const kernels::CausalAttnShape shape{c.n_heads, c.n_kv_heads, c.head_dim, c.sliding_window};
    kernels::causal_attention(&b.q[i0 * qd], qd, nq, p0, k_rows_.data(), v_rows_.data(), kvd, shape,
                              1.0f / std::sqrt(static_cast<float>(c.head_dim)), &out[i0 * qd], qd, pool_, scratch_,
                              opt_.batch_invariant ? kernels::CausalOrder::decode : kernels::CausalOrder::fast);
  }

  // One K/V head shared by every query head (Step-3's MFA): the multi-query kernel with the
  // heads as its vector dimension (kernels/cpu/mla_attention.h), tasks of (token, group of
  // heads) so that a small batch still occupies the pool; with fewer than kMqaStackRows heads,
  // the rows of consecutive tokens of one sequence share items (stacked_token_groups).
  void attend_mqa(int64_t layer, TokenBatch& b, float* out) {
    const ModelConfig& c = w_->config;
    const int64_t n = b.n, N = c.n_heads, hd = c.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    rows_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows_[i].bind(*kv_, layer, b.seq[i]);
    mqa_items_.clear();
    if (N < kMqaStackRows) {
      stacked_token_groups(
          n, N, [&](int64_t i) { return b.seq[i]; }, [&](int64_t i) { return b.pos[i]; }, row_ctx_,
          [&](int64_t i0, int64_t i1, const int64_t* ends) {
            mqa_items_.push_back(MqaItem{&b.q[i0 * c.q_dim()], hd, (i1 - i0) * N, &rows_[i0].k, &rows_[i0].v, hd,
                                         b.pos[i1 - 1] + 1, &out[i0 * c.q_dim()], hd, ends});
          });
    } else {
      head_group_tasks(n, N, pool_->size(), [&](int64_t i, int64_t h0, int64_t nh) {
        mqa_items_.push_back(MqaItem{&b.q[i * c.q_dim() + h0 * hd], hd, nh, &rows_[i].k, &rows_[i].v, hd, b.pos[i] + 1,
                                     &out[i * c.q_dim() + h0 * hd], hd});
      });
    }
    mqa_.run(*pool_, scratch_, mqa_items_, scale);
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
  ScratchArena scratch_;      // one slot per pool thread: RoPE tables, the per-token kernel's memory
  std::vector<float> q_low_;  // [n, q_lora_rank] low-rank query scratch
  std::vector<SeqRows> rows_;  // attend_mqa: per token of the batch
  std::vector<MqaItem> mqa_items_;  // attend_mqa: per (token, group of heads)
  MqaDecodeRunner mqa_;
  std::vector<double> inv_freq_;  // [head_dim / 2] plain RoPE frequencies theta^(-2i/head_dim)
  std::vector<int64_t> singles_;  // batch rows attended one at a time
  std::vector<int64_t> row_ctx_;  // attend_mqa, stacked items: [n, n_heads] each row's end
  std::vector<float> k_rows_, v_rows_;  // attend_run: [n_ctx, kv_dim] K and V rows as f32
};

}  // namespace

std::unique_ptr<AttentionVariant> make_gqa_attention(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv,
                                                     AttentionOptions opt, ThreadPool* pool) {
  return std::make_unique<GqaAttention>(std::move(w), kv, opt, pool);
}

}  // namespace afd
