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

// One Sampler per sequence: it owns the sequence's random stream.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [vocab]. Not modified.
  SampledToken sample(const float* logits, int64_t vocab);
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch
};

}  // namespace afd
