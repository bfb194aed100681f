// DeepSeek multi-head latent attention (MLA, MODELS.md B3/B4) as an AttentionVariant.
//
// Per token: q = q_b(rmsnorm(q_a(hn), q_a_norm)) (or q_proj(hn) without q LoRA) -> per head
// q_nope [P] ‖ q_pe [R]; a = kv_a(hn) -> latent c [Lkv] ‖ k_pe [R]; c_n = rmsnorm(c, kv_a_norm);
// RoPE (YaRN inverse frequencies, GPT-J or NEOX pairs, cos/sin scaled by the YaRN attention
// factor) on q_pe of every head and on k_pe; the cache row of (layer, token) is c_n ‖ k_pe
// (kv_layout: one K-only head of Lkv + R values).
// Attention, softmax scale qk_head_dim^-0.5 * mscale^2 (yarn_softmax_scale):
//   * a sequence's single token (decode): absorbed form — q_lat[h] = W_UK[h]^T q_nope[h],
//     o_lat[h] = MQA of q_lat ‖ q_pe over the cached rows (kernels/cpu/mla_attention.h),
//     o[h] = W_UV[h] o_lat[h];
//   * a run of at most kMaxAbsorbedRun consecutive tokens of one sequence (a speculative
//     verification item, a short prompt chunk): the absorbed form too, token by token — the
//     expanded form would decompress the whole context for a few queries;
//   * a longer run of consecutive tokens of one sequence (prefill chunk): expanded form —
//     k_nope ‖ v = kv_b(c_n) for every cached position, one key block at a time, causal
//     attention per head with keys k_nope[h] ‖ k_pe and an online softmax across the blocks
//     (two linear() products per head, block of query tokens and key block).
//     Precondition: the run's positions ascend and its last one is the largest.
//   * AttentionOptions::batch_invariant: every token in the absorbed form, whatever its run.
// Both read the latents back from the cache, so they see the same (possibly rounded) values;
// W_UK / W_UV are rows of kv_b read through the Matrix API (no copy; FP8 dequantized on the
// fly).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/rope.h"
#include "model/attention_variant.h"

namespace afd {

namespace {

class MlaAttention final : public AttentionVariant {
 public:
  MlaAttention(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv, AttentionOptions opt, ThreadPool* pool)
      : w_(std::move(w)),
        kv_(kv),
        opt_(opt),
        pool_(pool),
        scratch_(pool->size()),
        task_scratch_(static_cast<size_t>(pool->size())) {
    const ModelConfig& c = w_->config;
    const RopeScaling& rs = c.rope_scaling;
    const bool yarn = rs.type == RopeScaling::Type::yarn;
    inv_freq_.resize(static_cast<size_t>(c.qk_rope_head_dim / 2));
    kernels::rope_inv_freq(c.qk_rope_head_dim, c.rope_theta, yarn ? rs.factor : 0.0,
                           static_cast<double>(rs.original_max_position_embeddings), rs.beta_fast, rs.beta_slow,
                           inv_freq_.data());
    mag_ = yarn ? kernels::yarn_attention_factor(rs.factor, rs.mscale, rs.mscale_all_dim) : 1.0;
    scale_ = static_cast<float>(kernels::yarn_softmax_scale(c.qk_head_dim(), yarn ? rs.factor : 1.0,
                                                            yarn ? rs.mscale_all_dim : 0.0));
  }

  void attend(int64_t layer, TokenBatch& b, float* out) override {
    const ModelConfig& c = w_->config;
    const AttentionWeights& A = w_->layers[layer].attn;
    const int64_t n = b.n, N = c.n_heads, P = c.qk_nope_head_dim, R = c.qk_rope_head_dim, Lkv = c.kv_lora_rank;
    const int64_t QH = P + R, D = Lkv + R;
    const float eps = static_cast<float>(c.rms_norm_eps);
    float* q = b.q.data();  // [n, N, P + R]
    float* a = b.k.data();  // [n, Lkv + R]: the cache rows
    if (c.q_lora_rank > 0) {
      qa_.resize(static_cast<size_t>(n * c.q_lora_rank));
      linear(A.q_a, b.hn.data(), n, qa_.data(), opt_.prec, pool_, scratch_, opt_.order());
      kernels::rmsnorm(qa_.data(), A.q_a_norm.data, n, c.q_lora_rank, eps, qa_.data());
      linear(A.q, qa_.data(), n, q, opt_.prec, pool_, scratch_, opt_.order());
    } else {
      linear(A.q, b.hn.data(), n, q, opt_.prec, pool_, scratch_, opt_.order());
    }
    linear(A.kv_a, b.hn.data(), n, a, opt_.prec, pool_, scratch_, opt_.order());
    const int64_t half = R / 2;
    {
      // The RoPE tables of one position, in the calling thread's slot.
      ScratchSlot& own = scratch_.slot(0);
      ScratchSlot::Frame frame(own);
      float* const cs = own.take<float>(static_cast<size_t>(half));
      float* const sn = own.take<float>(static_cast<size_t>(half));
      for (int64_t i = 0; i < n; ++i) {
        kernels::rmsnorm(a + i * D, A.kv_a_norm.data, 1, Lkv, eps, a + i * D);
        kernels::rope_cos_sin(b.pos[i], inv_freq_.data(), half, mag_, cs, sn);
        kernels::rope_rotate(q + i * N * QH + P, N, QH, R, cs, sn, c.rope_interleave);
        kernels::rope_rotate(a + i * D + Lkv, 1, D, R, cs, sn, c.rope_interleave);
        kv_->write(layer, b.seq[i], b.pos[i], a + i * D, nullptr);
      }
    }
    // Runs of consecutive tokens of one sequence: short runs (decode, verification) in the
    // absorbed form, longer runs (prefill chunks) in the expanded form — or, batch-invariant,
    // every token in the absorbed form.
    decode_.clear();
    if (opt_.batch_invariant) {
      for (int64_t i = 0; i < n; ++i) decode_.push_back(i);
      return absorbed(layer, b, out);
    }
    for (int64_t i = 0; i < n;) {
      int64_t e = i + 1;
      while (e < n && b.seq[e] == b.seq[i]) ++e;
      if (e - i <= kMaxAbsorbedRun) {
        for (int64_t k = i; k < e; ++k) decode_.push_back(k);
      } else {
        expanded(layer, b, i, e, out);
      }
      i = e;
    }
    if (!decode_.empty()) absorbed(layer, b, out);
  }

 private:
  // Longest run computed in the absorbed form outside batch-invariant mode. Per query the
  // absorbed form reads the context's latent rows (Lkv + R values) twice; the expanded form
  // first decompresses every context row through kv_b (N * (P + V) * Lkv multiply-adds per
  // row, ~120x a query's latent work for DeepSeek-V3), so it only pays for runs of tens of
  // tokens. 16 covers every verification item (at most 9 tokens).
  static constexpr int64_t kMaxAbsorbedRun = 16;

  void absorbed(int64_t layer, TokenBatch& b, float* out) {
    const ModelConfig& c = w_->config;
    const AttentionWeights& A = w_->layers[layer].attn;
    const int64_t N = c.n_heads, P = c.qk_nope_head_dim, R = c.qk_rope_head_dim, V = c.v_head_dim;
    const int64_t Lkv = c.kv_lora_rank, QH = P + R, D = Lkv + R;
    const int64_t nd = static_cast<int64_t>(decode_.size());
    qlat_.resize(static_cast<size_t>(nd * N * D));
    olat_.resize(static_cast<size_t>(nd * N * Lkv));
    // q_lat[i][h] = W_UK[h]^T q_nope[i][h], per head (one task each) from W_UK[h] = rows
    // h*(P+V) .. +P of kv_b as f32; q_pe copied behind it. Few tokens: row by row, each row
    // converted once and added into every token's q_lat (axpy); more: W_UK[h] [P, Lkv] converted
    // whole and multiplied by the tokens' q_nope [nd, P] (matmul_f32), or, batch-invariant,
    // added row by row into blocks of kAxpyBlock tokens (the axpy order: each q_lat value one
    // chain over d = 0 .. P - 1, whatever nd). Crossover from whole DeepSeek-V3 bench steps
    // (docs/bench-log/2026-11-26-fp8-prefetch.md).
    static constexpr int64_t kAxpyMaxTokens = 2;
    static constexpr int64_t kAxpyBlock = 8;
    pool_->run(static_cast<int>(N), [&](int h, int thread) {
      // W_UK[h] as f32 (one row or all P) and the tokens' q_nope, in the task's slot.
      ScratchSlot& ts = task_scratch_[static_cast<size_t>(thread)].slot(0);
      ScratchSlot::Frame frame(ts);
      if (nd <= kAxpyMaxTokens) {
        float* const wuk = ts.take<float>(static_cast<size_t>(Lkv));
        for (int64_t k = 0; k < nd; ++k) std::fill_n(&qlat_[(k * N + h) * D], Lkv, 0.0f);
        for (int64_t d = 0; d < P; ++d) {
          matrix_row_f32(A.kv_b, h * (P + V) + d, wuk);
          for (int64_t k = 0; k < nd; ++k)
            kernels::axpy(b.q[decode_[k] * N * QH + h * QH + d], wuk, Lkv, &qlat_[(k * N + h) * D]);
        }
      } else if (opt_.batch_invariant) {
        float* const wuk = ts.take<float>(static_cast<size_t>(P * Lkv));
        for (int64_t d = 0; d < P; ++d) matrix_row_f32(A.kv_b, h * (P + V) + d, &wuk[d * Lkv]);
        for (int64_t k0 = 0; k0 < nd; k0 += kAxpyBlock) {
          const int64_t k1 = std::min(nd, k0 + kAxpyBlock);
          for (int64_t k = k0; k < k1; ++k) std::fill_n(&qlat_[(k * N + h) * D], Lkv, 0.0f);
          for (int64_t d = 0; d < P; ++d)
            for (int64_t k = k0; k < k1; ++k)
              kernels::axpy(b.q[decode_[k] * N * QH + h * QH + d], &wuk[d * Lkv], Lkv, &qlat_[(k * N + h) * D]);
        }
      } else {
        float* const wuk = ts.take<float>(static_cast<size_t>(P * Lkv));
        float* const qn = ts.take<float>(static_cast<size_t>(nd * P));
        for (int64_t d = 0; d < P; ++d) matrix_row_f32(A.kv_b, h * (P + V) + d, &wuk[d * Lkv]);
        for (int64_t k = 0; k < nd; ++k)
          std::memcpy(&qn[k * P], &b.q[decode_[k] * N * QH + h * QH], static_cast<size_t>(P) * 4);
        kernels::matmul_f32(qn, nd, P, P, wuk, Lkv, Lkv, &qlat_[h * D], N * D);
      }
      for (int64_t k = 0; k < nd; ++k)
        std::memcpy(&qlat_[(k * N + h) * D + Lkv], &b.q[decode_[k] * N * QH + h * QH + P], static_cast<size_t>(R) * 4);
    });
    blocks_.resize(static_cast<size_t>(nd));
    scales_.resize(static_cast<size_t>(nd));
    views_.resize(static_cast<size_t>(nd));
    for (int64_t k = 0; k < nd; ++k) views_[k] = paged_rows(*kv_, layer, b.seq[decode_[k]], 0, /*values=*/false, &blocks_[k], &scales_[k]);
    mqa_items_.clear();
    if (N < kMqaStackRows) {
      // Fewer heads than a register's lanes: the rows of consecutive tokens of one sequence (a
      // verification run, a short chunk) share an item, each row over its own token's positions
      // (row_ctx). Bits as with one item per token (mqa_decode_attend's row_ctx contract).
      stacked_token_groups(
          nd, N, [&](int64_t k) { return b.seq[decode_[k]]; }, [&](int64_t k) { return b.pos[decode_[k]]; }, row_ctx_,
          [&](int64_t k0, int64_t k1, const int64_t* ends) {
            mqa_items_.push_back(MqaItem{&qlat_[k0 * N * D], D, (k1 - k0) * N, &views_[k0], nullptr, Lkv,
                                         b.pos[decode_[k1 - 1]] + 1, &olat_[k0 * N * Lkv], Lkv, ends});
          });
    } else {
      head_group_tasks(nd, N, pool_->size(), [&](int64_t k, int64_t h0, int64_t nh) {
        mqa_items_.push_back(MqaItem{&qlat_[(k * N + h0) * D], D, nh, &views_[k], nullptr, Lkv, b.pos[decode_[k]] + 1,
                                     &olat_[(k * N + h0) * Lkv], Lkv});
      });
    }
    mqa_.run(*pool_, scratch_, mqa_items_, scale_);
    // o[i][h] = W_UV[h] o_lat[i][h], one head per task (a head's product alone is too small to
    // split across the pool).
    otmp_.resize(static_cast<size_t>(nd * N * V));
    pool_->run(static_cast<int>(N), [&](int h, int thread) {
      const Matrix wuv = matrix_rows(A.kv_b, h * (P + V) + P, (h + 1) * (P + V));
      linear(wuv, &olat_[h * Lkv], nd, N * Lkv, &otmp_[h * V], N * V, opt_.prec, nullptr,
             task_scratch_[static_cast<size_t>(thread)], false, opt_.order());
    });
    for (int64_t k = 0; k < nd; ++k)
      std::memcpy(out + decode_[k] * N * V, &otmp_[k * N * V], static_cast<size_t>(N * V) * 4);
  }

  // Tokens [i0, i1) of one sequence (each attends to the cached positions up to its own). The cached
  // positions [0, ctx) are expanded through kv_b one key block at a time (k_nope ‖ v of Kb
  // positions, [Kb, N, P + V]), so memory stays bounded however long the context; the softmax
  // runs online across the blocks (per query row and head: running max, running sum, and the
  // output row rescaled when the max grows), and the output rows are divided by the sum at the
  // end. Each cached latent is expanded once per call.
  void expanded(int64_t layer, TokenBatch& b, int64_t i0, int64_t i1, float* out) {
    const ModelConfig& c = w_->config;
    const AttentionWeights& A = w_->layers[layer].attn;
    const int64_t N = c.n_heads, P = c.qk_nope_head_dim, R = c.qk_rope_head_dim, V = c.v_head_dim;
    const int64_t Lkv = c.kv_lora_rank, QH = P + R, D = Lkv + R, OV = N * V;
    const int64_t seq = b.seq[i0];
    int64_t ctx = 0;
    for (int64_t i = i0; i < i1; ++i) ctx = std::max(ctx, b.pos[i] + 1);
    const int64_t m = i1 - i0;
    constexpr int64_t kBudgetBytes = int64_t{32} << 20;
    const int64_t kb = opt_.mla_key_block > 0
                           ? opt_.mla_key_block
                           : std::max<int64_t>(
                                 64, kBudgetBytes / (N * (P + V) * static_cast<int64_t>(sizeof(float))) / 64 * 64);
    const int64_t kb_max = std::min(kb, ctx);
    lat_.resize(static_cast<size_t>(kb_max * D));
    kvx_.resize(static_cast<size_t>(kb_max * N * (P + V)));
    run_max_.assign(static_cast<size_t>(m * N), -INFINITY);
    run_sum_.assign(static_cast<size_t>(m * N), 0.0f);
    for (int64_t i = i0; i < i1; ++i) std::fill(out + i * OV, out + (i + 1) * OV, 0.0f);
    for (int64_t j0 = 0; j0 < ctx; j0 += kb) {
      const int64_t kn = std::min(kb, ctx - j0);
      for (int64_t j = 0; j < kn; ++j) kv_->read_k(layer, seq, j0 + j, &lat_[j * D]);
      linear(A.kv_b, lat_.data(), kn, D, kvx_.data(), N * (P + V), opt_.prec, pool_, scratch_);  // [kn, N, P + V]
      // Per head (one task each): K_h [kn, P + R] = k_nope[h] ‖ k_pe and V_h^T [V, kn] of the
      // block, then for blocks of at most kRows query tokens: S = Q_h K_h^T * scale (causal:
      // the token at position p sees j <= p), the online softmax update, O_h += S V_h (both
      // products through linear(), with f32 rows of K_h / V_h^T as its weight matrix).
      pool_->run(static_cast<int>(N), [&](int h, int thread) {
        // K_h, V_h^T and the scores in the task's slot; its arena serves the products too.
        ScratchArena& task_arena = task_scratch_[static_cast<size_t>(thread)];
        ScratchSlot& ts = task_arena.slot(0);
        ScratchSlot::Frame frame(ts);
        float* const kh = ts.take<float>(static_cast<size_t>(kn * QH));
        float* const vt = ts.take<float>(static_cast<size_t>(V * kn));
        float* const s = ts.take<float>(static_cast<size_t>(std::min(kRows, m) * kn));
        for (int64_t j = 0; j < kn; ++j) {
          const float* kv = &kvx_[(j * N + h) * (P + V)];
          std::memcpy(&kh[j * QH], kv, static_cast<size_t>(P) * 4);
          std::memcpy(&kh[j * QH + P], &lat_[j * D + Lkv], static_cast<size_t>(R) * 4);
          for (int64_t v = 0; v < V; ++v) vt[v * kn + j] = kv[P + v];
        }
        for (int64_t r0 = 0; r0 < m; r0 += kRows) {
          const int64_t nr = std::min(kRows, m - r0);
          const int64_t t0 = i0 + r0;
          int64_t pmax = 0;
          for (int64_t r = 0; r < nr; ++r) pmax = std::max(pmax, b.pos[t0 + r]);
          if (pmax < j0) continue;  // no row here sees a key of this block
          kernels::linear(&b.q[t0 * N * QH + h * QH], nr, N * QH, kh, DType::f32, kn, QH, s, kn, opt_.prec, nullptr,
                          task_arena);
          for (int64_t r = 0; r < nr; ++r) {
            float* sr = &s[r * kn];
            const int64_t valid = std::min(kn, b.pos[t0 + r] + 1 - j0);  // keys j0 .. pos
            float* o = out + (t0 + r) * OV + h * V;
            float& mx = run_max_[(r0 + r) * N + h];
            float& sum = run_sum_[(r0 + r) * N + h];
            if (valid <= 0) {
              std::fill(sr, sr + kn, 0.0f);
              continue;
            }
            const float nmax = std::max(mx, kernels::scale_max(sr, valid, scale_));
            const float corr = std::exp(mx - nmax);  // 0 on the row's first block (mx = -inf)
            const float bsum = kernels::exp_sub_sum(sr, valid, nmax);
            std::fill(sr + valid, sr + kn, 0.0f);
            sum = sum * corr + bsum;
            mx = nmax;
            if (corr != 1.0f)
              for (int64_t v = 0; v < V; ++v) o[v] *= corr;
          }
          kernels::linear(s, nr, kn, vt, DType::f32, V, kn, out + t0 * OV + h * V, OV, opt_.prec, nullptr, task_arena,
                          /*accumulate=*/true);
        }
      });
    }
    for (int64_t r = 0; r < m; ++r)
      for (int64_t h = 0; h < N; ++h) {
        const float inv = 1.0f / run_sum_[r * N + h];
        float* o = out + (i0 + r) * OV + h * V;
        for (int64_t v = 0; v < V; ++v) o[v] *= inv;
      }
  }

  static constexpr int64_t kRows = 128;  // query tokens per product in the expanded form

  std::shared_ptr<const ModelWeights> w_;
  PagedKvCache* kv_;
  AttentionOptions opt_;
  ThreadPool* pool_;
  std::vector<double> inv_freq_;
  double mag_ = 1.0;
  float scale_ = 1.0f;
  // The kernels' working memory: scratch_ one slot per pool thread (products over the pool, the
  // MQA tasks); task_scratch_[t] one slot, for what a task on pool thread t computes alone
  // (W_UK / K_h / V_h^T buffers and the per-head products).
  ScratchArena scratch_;
  std::vector<ScratchArena> task_scratch_;
  // Scratch, reused across calls.
  std::vector<float> qa_, qlat_, olat_, otmp_, lat_, kvx_, run_max_, run_sum_;
  std::vector<int64_t> decode_, row_ctx_;
  std::vector<std::vector<const uint8_t*>> blocks_;
  std::vector<std::vector<const float*>> scales_;
  std::vector<kernels::PagedRows> views_;
  std::vector<MqaItem> mqa_items_;
  MqaDecodeRunner mqa_;
};

}  // namespace

std::unique_ptr<AttentionVariant> make_mla_attention(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv,
                                                     AttentionOptions opt, ThreadPool* pool) {
  return std::make_unique<MlaAttention>(std::move(w), kv, opt, pool);
}

}  // namespace afd
