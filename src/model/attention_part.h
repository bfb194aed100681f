// AttentionPart: the attention half of every decoder layer, plus embedding and LM head —
// everything an attention worker computes. Stateful through the KV cache.
//
// Per layer l, for a TokenBatch b (whose KV slots for b.pos were appended beforehand):
//   hn = rmsnorm(x, input_norm); a = attention(hn) (the config's AttentionVariant, which also
//   writes the layer's KV); x += o_proj(a); h = rmsnorm(x, post_attention_norm);
//   MoE layers: topk_ids / topk_w = route_tokens(router(h)) (model/router.h).
// The FFN half (ffn_part.h) then produces ffn_out and add_ffn() does x += ffn_out.
// Threading: one call at a time per AttentionPart; kernels use the given pool.
#pragma once

#include <memory>
#include <span>

#include "core/scratch_arena.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"
#include "kv/paged_kv_cache.h"
#include "model/attention_variant.h"
#include "model/token_batch.h"
#include "model/weights.h"

namespace afd {

class AttentionPart {
 public:
  AttentionPart(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv, AttentionOptions opt,
                ThreadPool* pool);

  const ModelConfig& config() const { return w_->config; }
  const ModelWeights& weights() const { return *w_; }

  // x[i] = embed[tokens[i]]. Precondition: every token id < vocab (the engine validates).
  void embed(TokenBatch& b) const;
  // The attention half of `layer` (see above): updates x, fills h and, for MoE layers,
  // topk_ids / topk_w.
  void forward(int64_t layer, TokenBatch& b);
  // x += ffn_out.
  void add_ffn(TokenBatch& b) const;
  // logits [rows.size(), vocab] = lm_head(rmsnorm(x[rows], final_norm)).
  void logits(const TokenBatch& b, std::span<const int64_t> rows, float* out);
  // hidden [rows.size(), hidden_size] = rmsnorm(x[rows], final_norm): the final-normed states
  // logits() multiplies by the LM head (DeepSeek's MTP module reads them, model/weights.h).
  void final_hidden(const TokenBatch& b, std::span<const int64_t> rows, float* out) const;

 private:
  void route(int64_t layer, TokenBatch& b);

  std::shared_ptr<const ModelWeights> w_;
  AttentionOptions opt_;
  ThreadPool* pool_;
  std::unique_ptr<AttentionVariant> attention_;
  std::vector<float> final_scratch_;
  ScratchArena scratch_;  // one slot per pool thread: the o_proj, router and LM head products
};

}  // namespace afd
