// Speculative decoding: drafting beside the engine, verification inside its step.
//
// A Drafter proposes up to k tokens per sequence (NgramDrafter: prompt lookup; MtpDrafter:
// DeepSeek's MTP module, applied recursively for k > 1). The driver — generate() and the
// serving scheduler — forwards [last sampled token, d1 .. dk] as one BatchItem (n_draft = k,
// all_logits) in the same forward pass as every other sequence's decode or prefill chunk.
// Row j of its logits predicts the token after position j; verify_drafts() walks the rows
// with Sampler::verify (exact: greedy output equals non-speculative greedy output whenever
// the rows equal the single-token decode rows, which --deterministic guarantees in fast
// precision and reference precision gives to within its rounding; sampled output has the
// target distribution), and Engine::settle_drafts keeps the accepted drafts' KV.
// Threading: a Drafter is driven by the engine's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "runtime/engine.h"
#include "runtime/engine_options.h"
#include "runtime/sampler.h"

namespace afd {

struct ModelWeights;
class MtpHead;

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Sequences are named by the caller's key (e.g. the engine's sequence id); releasing an
  // unknown key does nothing.
  virtual Status add_sequence(int64_t key) { return Status(); }
  virtual void release_sequence(int64_t key) {}
  // Whether observe() needs the main model's final-normed hidden states
  // (Engine::forward_with_hidden, one row per forwarded position: all_logits).
  virtual bool needs_hidden() const { return false; }
  // Positions [pos, pos + n) of `key` are final (computed and accepted): hidden [n, H] the main
  // model's final-normed states there, next [n] the tokens at positions pos+1 .. pos+n. Calls
  // for one key come in position order without gaps, starting at 0.
  virtual Status observe(int64_t key, int64_t pos, std::span<const float> hidden, std::span<const int32_t> next) {
    return Status();
  }
  struct Query {
    int64_t key = -1;
    std::span<const int32_t> context;  // the sequence's tokens so far; the last is not forwarded yet
    int64_t max_drafts = 0;
  };
  // drafts[i] receives at most queries[i].max_drafts tokens continuing queries[i].context
  // (possibly none). Errors are the drafter's own (an MTP head out of KV, ...).
  virtual Status propose(std::span<const Query> queries, std::vector<std::vector<int32_t>>* drafts) = 0;
};

// Prompt lookup (as llama.cpp's and vLLM's n-gram speculation): for n = ngram_max down to
// ngram_min, the latest earlier occurrence of the context's last n tokens; the drafts are the
// tokens that followed it. Stateless.
class NgramDrafter : public Drafter {
 public:
  NgramDrafter(int64_t ngram_min, int64_t ngram_max) : min_(ngram_min), max_(ngram_max) {}
  Status propose(std::span<const Query> queries, std::vector<std::vector<int32_t>>* drafts) override;
  // One context's drafts (the lookup above).
  std::vector<int32_t> lookup(std::span<const int32_t> context, int64_t max_drafts) const;

 private:
  int64_t min_, max_;
};

// DeepSeek-V3's MTP module as the drafter (runtime/mtp_head.h): the module's own KV cache
// follows every final position of the sequence (observe()); d1 is the argmax of the module at
// the last final position (hidden h[L-1], token t[L]); d2.. apply it again on its own block
// output and the previous draft at the next positions, whose KV is dropped before the next
// proposal.
class MtpDrafter : public Drafter {
 public:
  explicit MtpDrafter(std::unique_ptr<MtpHead> head);
  ~MtpDrafter() override;
  Status add_sequence(int64_t key) override;
  void release_sequence(int64_t key) override;
  bool needs_hidden() const override { return true; }
  Status observe(int64_t key, int64_t pos, std::span<const float> hidden, std::span<const int32_t> next) override;
  Status propose(std::span<const Query> queries, std::vector<std::vector<int32_t>>* drafts) override;

 private:
  struct Seq {
    int64_t head_seq = -1;
    int64_t n_final = 0;            // positions of the head's sequence computed from final inputs
    std::vector<float> pending_hidden;  // observed rows of positions n_final.. not yet run through the module
    std::vector<int32_t> pending_next;
  };
  std::unique_ptr<MtpHead> head_;
  std::unordered_map<int64_t, Seq> seqs_;
};

// The drafter opt.speculative asks for (null for none). mtp: DeepSeek checkpoints with MTP
// layers only (module 0; its KV cache sized as opt.kv; it computes on engine's compute_pool()
// when an engine is given, else on a pool of its own); errors name the problem.
Result<std::unique_ptr<Drafter>> make_drafter(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights,
                                              const Engine* engine = nullptr);

// Verifies drafts against the logits rows of their item: rows [drafts.size() + 1, vocab],
// row j predicting the token after drafts[j - 1] (row 0: after the last sampled token).
// Returns the emitted tokens: the accepted drafts, then the first correction (a rejected
// position's replacement) or, when every draft was accepted, a token sampled from the last
// row. So the result has accepted + 1 tokens, accepted = result.size() - 1.
// masks: empty, or one token mask per row (Sampler::sample's `allowed`; structured outputs:
// row j's mask is the grammar's after drafts[0, j), and each draft is allowed by its row's).
std::vector<SampledToken> verify_drafts(Sampler& sampler, const float* rows, int64_t vocab,
                                        std::span<const int32_t> drafts,
                                        std::span<const uint64_t* const> masks = {});

// Counters of a speculative run (generate(), afd bench --json, /metrics).
struct SpeculativeStats {
  int64_t steps = 0;             // verification items (one sequence, one step)
  int64_t drafts_proposed = 0;
  int64_t drafts_accepted = 0;
  int64_t tokens_emitted = 0;    // by verification items: accepted + 1 each
  std::vector<int64_t> proposed_at, accepted_at;  // [k]: by draft position
  void record(int64_t proposed, int64_t accepted);
  void add(const SpeculativeStats& o);
};

}  // namespace afd
