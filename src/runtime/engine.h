// Engine: the batched forward pass that serving and generation drive, independent of
// how a layer's attention and FFN parts are wired (monolithic, AFD, EP).
//
// Threading: an Engine is driven by one thread at a time (the scheduler's step loop).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace afd {

struct FfnWorkerStats;
class ThreadPool;

// One sequence's work in a forward pass: append `tokens` (a prompt chunk, or the single
// last sampled token) at the sequence's current length, compute, and return logits.
struct BatchItem {
  int64_t seq_id = -1;
  std::span<const int32_t> tokens;
  bool all_logits = false;  // logits for every appended token, else only the last one
  // Speculative decoding: the last n_draft of `tokens` are drafts. They are computed like
  // the others (their KV is written at their positions) but stay provisional until
  // Engine::settle_drafts says how many the caller accepted. 0 <= n_draft < tokens.size().
  int64_t n_draft = 0;
};

struct KvUsage {
  int64_t blocks_total = 0;
  int64_t blocks_used = 0;    // referenced by live sequences (evictable cached blocks are free)
  int64_t block_size = 0;  // tokens per block
};

// One decoder layer's stage times in a forward pass (seconds, summed over micro-batches):
//   attention_s: attention half (norm, attention, residual, router) on the attention side;
//   a2f_s: encoding and posting the A->F transfer (0 in the monolithic wiring, where the
//          FFN runs inside dispatch and counts as ffn_s);
//   ffn_s: FFN compute (remote: as the FFN workers report it, the slowest one per micro-batch);
//   f2a_s: attention side blocked in combine (waiting for, decoding and adding the F->A
//          replies): the part of FFN + transfer time the micro-batch pipeline did not hide.
struct LayerStageTimes {
  double attention_s = 0, a2f_s = 0, ffn_s = 0, f2a_s = 0;
  // this += k * o, stage by stage (sums over steps, means over engines).
  void add(const LayerStageTimes& o, double k = 1.0) {
    attention_s += k * o.attention_s;
    a2f_s += k * o.a2f_s;
    ffn_s += k * o.ffn_s;
    f2a_s += k * o.f2a_s;
  }
};

// Per-step stage times (seconds) of the last forward pass: the sums of `layers`, plus the
// embedding and LM head in attention_s. With several attention or FFN instances,
// attention_s / ffn_s are means over the instances, so 1 - attention_s / total_s and
// 1 - ffn_s / total_s are the idle ratios eta_A and eta_F of the A/F ratio paper, eq. (23).
struct StageTimes {
  double attention_s = 0, a2f_s = 0, ffn_s = 0, f2a_s = 0, total_s = 0;
  std::vector<LayerStageTimes> layers;  // [n_layers]; empty where not measured
};

// What `afd bench` and `afd calibrate` ask of an engine beyond serving; an engine offers it
// through Engine::benchmark_hooks(). Driven by the engine's one thread, like the engine.
class BenchmarkHooks {
 public:
  // Appends n_tokens positions with synthetic K/V (not a model computation) so decode can be
  // timed at a long context without an O(context^2) prefill.
  virtual Status fill_synthetic_context(int64_t seq_id, int64_t n_tokens) = 0;
  // Expert weight sets read by the last forward (sum over layers and micro-batches of the
  // distinct routed experts).
  virtual int64_t last_expert_reads() const = 0;
  // Tokens each attention engine of an in-process bundle ran in the last forward (its share
  // of the batch); empty for a single engine.
  virtual std::vector<int64_t> last_engine_tokens() const { return {}; }
  // The counters of the FFN workers running in this process (an in-process bundle's, in shard
  // order; valid while the engine lives); empty where there are none.
  virtual std::vector<const FfnWorkerStats*> ffn_stats() const { return {}; }

 protected:
  ~BenchmarkHooks() = default;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ModelConfig& config() const = 0;

  // Creates an empty sequence. Fails with resource_exhausted when no slot is free.
  virtual Result<int64_t> create_sequence() = 0;
  // Frees the sequence and its KV blocks; unknown ids are ignored.
  virtual void release_sequence(int64_t seq_id) = 0;
  // Current length (tokens with KV) of a sequence, or -1 if unknown.
  virtual int64_t sequence_length(int64_t seq_id) const = 0;
  // Whether n more tokens fit for this sequence (context limit and free KV blocks;
  // evictable prefix-cache blocks count as free).
  virtual bool can_append(int64_t seq_id, int64_t n_tokens) const = 0;
  // KV blocks the pool must hand out to grow seq_id by n_tokens, as the KV manager counts them
  // (0 when they fit in the blocks the sequence holds); for seq_id == kNewSequence, the blocks
  // a new sequence of n_tokens takes when no prefix-cache block is reused. -1 for an unknown
  // sequence; 0 for engines that report no block pool (KvUsage::blocks_total == 0).
  static constexpr int64_t kNewSequence = -1;
  virtual int64_t kv_blocks_needed(int64_t seq_id, int64_t n_tokens) const = 0;
  // KV block pools. A sequence takes blocks from one pool only; an engine over several
  // attention engines (DataParallelEngine) has one pool per engine, so a batch fits when each
  // pool's share of it fits that pool, not when the sum fits the sum. kv_pool: the pool of a
  // live sequence (-1 if unknown); kv_pool_usage: that pool's blocks (kv_usage() is the sum).
  virtual int kv_pool(int64_t seq_id) const { return sequence_length(seq_id) < 0 ? -1 : 0; }
  virtual KvUsage kv_pool_usage(int pool) const { return kv_usage(); }

  // Prefix caching: for an EMPTY sequence about to compute `prompt` (prompt tokens, or
  // prompt + generated tokens when re-admitted after preemption), maps the longest prefix
  // of whole KV blocks already computed for the same tokens (by any sequence, live or
  // released but not yet evicted) into it, capped so that at least one token of `prompt`
  // is still computed (the step needs its logits). Returns the tokens now present
  // (sequence_length), which the caller must not send again; the caller continues with
  // prompt[returned:]. 0 when nothing matched, caching is off, or the sequence is unknown
  // or not empty. Blocks get their keys once full after a successful forward; a failed
  // forward leaves no trace. Engines without a prefix cache return 0.
  virtual int64_t reuse_prefix(int64_t seq_id, std::span<const int32_t> prompt) { return 0; }
  // Tokens reuse_prefix would map for this prompt now, without mapping anything (placement
  // decisions); 0 for engines without a prefix cache.
  virtual int64_t cached_prefix(std::span<const int32_t> prompt) const { return 0; }

  // Runs one forward pass over the batch. logits receives, per item in order, one row
  // [vocab] (or one per token when all_logits). Errors (unknown sequence, token outside
  // the vocabulary, context overflow, KV exhausted, a lost peer) leave every sequence
  // unchanged.
  virtual Status forward(std::span<const BatchItem> items, std::vector<float>* logits) = 0;
  // forward(), and hidden receives, for every row logits gets and in the same order, the
  // final-normed hidden state rmsnorm(x, model.norm) [hidden_size] the LM head multiplies —
  // the input of DeepSeek's MTP module (runtime/mtp_head.h). not_supported by engines that
  // do not keep it.
  virtual Status forward_with_hidden(std::span<const BatchItem> items, std::vector<float>* logits,
                                     std::vector<float>* hidden) {
    return not_supported("this engine does not return hidden states");
  }

  // Speculative decoding: after a successful forward in which seq's item had n_draft > 0,
  // keeps the first n_accepted drafts (their KV stays and their tokens count as computed, for
  // the prefix cache too) and drops the rest: the sequence length shrinks by
  // n_draft - n_accepted, no KV is copied. Must be called before seq's next forward (which
  // fails while drafts are unsettled). invalid_argument for an unknown sequence, one
  // without unsettled drafts, or n_accepted outside [0, n_draft]. Engines that cannot
  // verify drafts return not_supported (and refuse items with n_draft > 0).
  virtual Status settle_drafts(int64_t seq_id, int64_t n_accepted) {
    return not_supported("this engine does not verify draft tokens");
  }

  virtual KvUsage kv_usage() const = 0;
  virtual StageTimes last_stage_times() const { return {}; }
  // ok when a forward pass can run now; otherwise why not (unavailable: a remote FFN worker
  // is not connected). Thread-safe, unlike the rest of this interface: health checks call
  // it while the engine runs.
  virtual Status health() const { return Status(); }

  // The thread pool the engine's attention runs on, for work its driver runs between forward
  // passes on the same thread (the MTP drafter), so that two pools do not contend for the
  // cores; null when there is none to share.
  virtual std::shared_ptr<ThreadPool> compute_pool() const { return nullptr; }

  // This engine's benchmark hooks; nullptr for an engine without them.
  virtual BenchmarkHooks* benchmark_hooks() { return nullptr; }
};

}  // namespace afd
