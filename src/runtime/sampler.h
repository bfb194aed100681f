// Sampling from a row of vocabulary logits: greedy, temperature, top-k, top-p; seeded and
// reproducible (the same seed and logits give the same tokens on every machine).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "core/status.h"

namespace afd {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // (0, 1]
  int64_t top_k = 0;         // 0: no limit
  uint64_t seed = 0;
  int64_t n_top_logprobs = 0;  // alternatives to report with each token (0..20)
  // Range checks for values that come from requests or flags.
  Status validate() const;
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;  // log-softmax of the raw (temperature 1) logits at `token`
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first, n_top_logprobs entries
};

// One Sampler per sequence: it owns the sequence's random stream (seeded with params().seed).
// Its position in that stream (draws()) is all the state sampling carries from one token to
// the next, so a sequence continued elsewhere (an attention worker failover, docs/
// FAILOVER.md) samples exactly as the original would have after skip(draws()).
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [vocab]. Not modified. Draws one number from the stream when temperature > 0,
  // none when greedy.
  SampledToken sample(const float* logits, int64_t vocab);
  const SamplingParams& params() const { return p_; }
  // Numbers drawn from the random stream so far (including skipped ones).
  uint64_t draws() const { return draws_; }
  // Advances the stream by n numbers, as n draws would.
  void skip(uint64_t n);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch
};

}  // namespace afd
