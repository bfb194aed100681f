// MtpHead: runs DeepSeek's multi-token-prediction module (model/weights.h MtpModule,
// MODELS.md B7) beside an engine: for each position i of a sequence it takes the main
// model's final-normed hidden state h[i] (Engine::forward_with_hidden) and the next token
// t[i+1], and returns the module's logits for t[i+2]. The module's decoder layer keeps its own
// KV cache (one layer, sequences of its own) and runs entirely in this process — attention and
// its MoE FFN (LocalFfnBackend) — whatever the main engine's wiring.
// Recursive drafting (k drafts per step from the one module, as vLLM does): at position i on
// (h[i], t[i+1]) -> d1 and the block output b1, then at i+1 on (b1, d1) -> d2, b2, and so on;
// then truncate(seq, i + 1) drops the speculative positions before position i+1 is computed
// from true inputs (tests/reference/mtp_draft_ref.py is the float64 reference, MODELS.md B7).
// Threading: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/scratch_arena.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/paged_kv_cache.h"
#include "model/attention_part.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/engine_options.h"
#include "runtime/ffn_backend.h"

namespace afd {

class MtpHead {
 public:
  // Uses opt.precision, opt.kv (dtype, block size, capacity, max sequences) and runs on `pool`
  // (e.g. its engine's Engine::compute_pool(), when the head runs between the engine's forward
  // passes), or when null on a pool of its own with opt.n_threads; the wiring options do not apply.
  static Result<std::unique_ptr<MtpHead>> create(MtpModule module, const EngineOptions& opt,
                                                 std::shared_ptr<ThreadPool> pool = nullptr);

  const ModelConfig& config() const { return module_.block->config; }
  Result<int64_t> create_sequence();
  void release_sequence(int64_t seq_id);  // unknown ids are ignored
  KvUsage kv_usage() const;

  // One sequence's work: positions len .. len+n-1 of seq, with hidden [n, hidden_size] the
  // main model's final-normed states there and next_tokens [n] the tokens one position later.
  struct Item {
    int64_t seq_id = -1;
    std::span<const float> hidden;
    std::span<const int32_t> next_tokens;
  };
  // Appends every item's positions and writes logits [n, vocab] per item, in order (row i
  // predicts the token two positions after position len + i). Errors (unknown sequence,
  // sizes that disagree, a token outside the vocabulary, context or KV exhausted) leave every
  // sequence unchanged.
  // block_out (may be null) receives rows [n, hidden_size] in the same order: the module's
  // decoder-layer output (the residual stream after its attention and FFN, before
  // shared_head.norm), the hidden input of a recursive application (runtime/speculative.h).
  Status forward(std::span<const Item> items, std::vector<float>* logits, std::vector<float>* block_out = nullptr);
  // Tokens in seq's cache (-1 if unknown).
  int64_t sequence_length(int64_t seq_id) const { return kv_->length(seq_id); }
  // Drops positions >= new_length of seq (speculative positions); no-op when new_length >=
  // its length or the id is unknown.
  void truncate(int64_t seq_id, int64_t new_length);

 private:
  MtpHead(MtpModule module, std::unique_ptr<PagedKvCache> kv, std::shared_ptr<ThreadPool> pool, AttentionOptions ao,
          LocalFfnOptions fo, int64_t max_seqs);

  MtpModule module_;
  std::unique_ptr<PagedKvCache> kv_;
  std::shared_ptr<ThreadPool> pool_;
  AttentionPart attn_;
  LocalFfnBackend ffn_;
  kernels::ActPrecision prec_;
  kernels::LinearOrder order_;
  int64_t max_seqs_;
  int64_t next_seq_ = 0, n_live_ = 0;
  TokenBatch b_;
  std::vector<float> cat_;  // [n, 2*hidden]: rmsnorm(embed, enorm) then rmsnorm(h, hnorm)
  ScratchArena scratch_;    // one slot per pool thread: the eh_proj product
};

}  // namespace afd
