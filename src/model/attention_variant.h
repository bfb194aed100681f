// AttentionVariant: how one decoder layer's attention is computed — the single place where
// attention kinds (ModelConfig::attention) differ. AttentionPart (attention_part.h) does the
// rest of the layer (norms, o_proj, residual, routing) the same way for every kind.
//
//   gqa (attention_gqa.cpp): Qwen / Mixtral grouped-query attention; with a low-rank query
//        (q_lora_rank > 0) Step-3's MFA.
//   mla (attention_mla.cpp): DeepSeek multi-head latent attention.
//
// The KV cache holds, per token and layer, kv_layout(config) values: n_kv_heads heads of a
// k_dim-wide key and a v_dim-wide value (v_dim 0: a K-only cache, KvCacheConfig::k_only; the
// value is read from the key row, as MLA's latent cache does: one head of kv_lora_rank +
// qk_rope_head_dim values, the normalized latent then the rotated rope key).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/scratch_arena.h"
#include "core/thread_pool.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/ops.h"
#include "kv/paged_kv_cache.h"
#include "model/token_batch.h"
#include "model/weights.h"

namespace afd {

struct AttentionOptions {
  kernels::ActPrecision prec = kernels::ActPrecision::f32;
  // MLA's expanded form (prefill chunks): cached positions expanded through kv_b per block; 0 =
  // as many as fit a 32 MiB budget (at least 64). Tests set it small to cross block edges.
  int64_t mla_key_block = 0;
  // Batch invariance (--deterministic): every query token's output is a function of its own
  // query, its sequence's cache rows 0 .. pos, the shapes, the KV dtype and the ISA level —
  // never of the run it came in (a prefill chunk of any length, where chunks start, a decode
  // step), the other tokens of the batch or the pool size — given that linear() rows are
  // independent of n. true: GQA runs of prompt tokens take the blocked kernel in the per-token
  // kernel's order (kernels::CausalOrder::decode); MLA attends every token in the absorbed form
  // (a prefill run's tokens each over their own causal prefix) with q_lat in one order for any
  // number of tokens. MFA (attend_mqa) is invariant either way: mqa_decode_attend's heads are
  // independent lanes and its split-K segments fixed by position. false: the faster orders
  // (GQA runs: kernels::CausalOrder::fast; MLA runs of several tokens: the expanded form).
  bool batch_invariant = false;
  // The order of the attention side's matrix products (projections, router, LM head): the
  // canonical one when batch_invariant.
  kernels::LinearOrder order() const {
    return kernels::linear_order(batch_invariant);
  }
};

struct KvLayout {
  int64_t n_kv_heads = 0;
  int64_t k_dim = 0;
  int64_t v_dim = 0;
};
KvLayout kv_layout(const ModelConfig& c);

// The K rows (or, with values, the V rows) of KV head `head` of seq's cache at `layer`, as the
// multi-query decode kernel reads them (kernels/cpu/mla_attention.h). The view points into
// *blocks and *scales, which this fills and which must outlive it.
kernels::PagedRows paged_rows(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t head, bool values,
                              std::vector<const uint8_t*>* blocks, std::vector<const float*>* scales);
// The same into caller-owned arrays with room for kv.block_table(seq).size() pointers each
// (scales is written for an fp8 cache only).
kernels::PagedRows paged_rows(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t head, bool values,
                              const uint8_t** blocks, const float** scales);

// One multi-query decode (kernels::mqa_decode_attend): n_heads query heads of one token over
// one K/V head's rows (v null: the values are the keys' first v_dim values), n_ctx positions;
// or, with row_ctx (n_heads ends, mqa_decode_attend's contract), the query rows of several
// consecutive tokens of one sequence, each row over its own token's positions.
struct MqaItem {
  const float* q = nullptr;
  int64_t q_stride = 0;
  int64_t n_heads = 0;
  const kernels::PagedRows* k = nullptr;
  const kernels::PagedRows* v = nullptr;
  int64_t v_dim = 0;
  int64_t n_ctx = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  const int64_t* row_ctx = nullptr;
};

// Runs multi-query decodes over a pool. With at least as many items as threads (or no context
// longer than one segment), one task per item; otherwise the items' split-K segments
// (kernels::mqa_decode_segment) are the tasks and each item's segments are combined in order
// afterwards, so a long context occupies the whole pool at batch 1. Either way every output bit
// is what mqa_decode_attend gives.
class MqaDecodeRunner {
 public:
  // scratch: one slot per pool thread (at least pool.size()); the task on pool thread t takes
  // from slot t the kernels' working memory while it runs.
  void run(ThreadPool& pool, ScratchArena& scratch, const std::vector<MqaItem>& items, float scale);

 private:
  std::vector<int64_t> seg_item_, seg_index_, first_seg_;  // per segment task; per item
  std::vector<float> o_, ml_;                               // partials: [segments][heads][v_dim], m and l
  std::vector<kernels::MqaPartial> parts_;
};

// Query rows per stacked MQA item (one AVX-512 register of f32 lanes): a model whose tokens
// have fewer query heads than this shares items among consecutive tokens of one sequence.
inline constexpr int64_t kMqaStackRows = 16;

// Groups tokens 0 .. n-1 (seq_of(k), pos_of(k)) for stacked MQA items: each run of consecutive
// positions of one sequence whose ends lie in the same split-K segment is cut into about
// n_heads * len / kMqaStackRows groups of equal length. row_ctx becomes [n, n_heads], each row's
// end (its token's pos + 1); emit(k0, k1, ends) is called per group, in order, with ends =
// &row_ctx[k0 * n_heads] for a group of several tokens (MqaItem::row_ctx) and null for one.
template <class SeqOf, class PosOf, class Emit>
void stacked_token_groups(int64_t n, int64_t n_heads, SeqOf seq_of, PosOf pos_of, std::vector<int64_t>& row_ctx,
                          Emit emit) {
  row_ctx.resize(static_cast<size_t>(n * n_heads));
  for (int64_t k = 0; k < n; ++k) std::fill_n(&row_ctx[k * n_heads], n_heads, pos_of(k) + 1);
  for (int64_t k = 0; k < n;) {
    int64_t e = k + 1;
    while (e < n && seq_of(e) == seq_of(k) && pos_of(e) == pos_of(e - 1) + 1 &&
           kernels::mqa_decode_segments(pos_of(e) + 1) == kernels::mqa_decode_segments(pos_of(k) + 1))
      ++e;
    const int64_t m = e - k, items = (m * n_heads + kMqaStackRows - 1) / kMqaStackRows, per = (m + items - 1) / items;
    for (int64_t k0 = k; k0 < e; k0 += per) {
      const int64_t k1 = std::min(e, k0 + per);
      emit(k0, k1, k1 - k0 > 1 ? &row_ctx[k0 * n_heads] : nullptr);
    }
    k = e;
  }
}

// Tasks of (token, group of heads) for MQA items with the heads in vector lanes, enough of them
// to occupy `workers` threads: groups of a multiple of 32 heads, at most ceil(n_heads / 32) per
// token. emit(k, h0, nh) per task, tokens in order and a token's groups in head order.
template <class Emit>
void head_group_tasks(int64_t n, int64_t n_heads, int64_t workers, Emit emit) {
  if (n <= 0) return;
  const int64_t max_groups = (n_heads + 31) / 32;
  const int64_t groups = std::clamp<int64_t>((workers + n - 1) / n, 1, max_groups);
  const int64_t hg = std::min<int64_t>(n_heads, ((n_heads + groups - 1) / groups + 31) / 32 * 32);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t h0 = 0; h0 < n_heads; h0 += hg) emit(k, h0, std::min(hg, n_heads - h0));
}

class AttentionVariant {
 public:
  virtual ~AttentionVariant() = default;
  // For the n tokens of b (their KV slots at b.pos already appended to the cache):
  // reads b.hn [n, hidden] (input-normed hidden states), writes this layer's K/V for them into
  // the cache, and writes out [n, config.o_in_dim()] (the o_proj input). May use b.q / b.k /
  // b.v as scratch. One call at a time per object.
  virtual void attend(int64_t layer, TokenBatch& b, float* out) = 0;
};

// The variant for w->config.attention. `kv` and `pool` must outlive the result.
std::unique_ptr<AttentionVariant> make_attention_variant(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv,
                                                         AttentionOptions opt, ThreadPool* pool);
std::unique_ptr<AttentionVariant> make_gqa_attention(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv,
                                                     AttentionOptions opt, ThreadPool* pool);
std::unique_ptr<AttentionVariant> make_mla_attention(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv,
                                                     AttentionOptions opt, ThreadPool* pool);

}  // namespace afd
