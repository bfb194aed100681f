// Expert load of an xA-yF bundle's FFN group: per MoE layer, how far the most-loaded of the y FFN
// workers is above the mean when tokens route to a skewed set of experts, under afd's contiguous
// placement or an EPLB placement (plan/eplb.h) planned from a sampled window. The simulator
// (plan/simulator.h) scales each layer's FFN batch by it. The model's assumptions:
//   - popularity: the expert of rank r (0-based) has weight 1/(r+1)^s; every layer profile ranks
//     the experts by its own seeded permutation, so different layers have different hot experts;
//   - routing: a token picks top_k DISTINCT experts, one after another, each with probability
//     proportional to its weight among the experts not yet picked (plan/topk_sampler.h);
//   - truth: each rank's share of (token, expert) pairs is a Monte-Carlo estimate over
//     kTruthPairs / top_k seeded tokens (one estimate by rank, permuted per layer);
//   - plan: contiguous_placement, or eplb_placement of the counts of window_tokens tokens sampled
//     independently of the truth (the plan sees sampled counts, not the truth);
//   - imbalance: the placement's worker loads under the true shares (a replica gets its expert's
//     share / its replica count), max / mean.
// Deterministic: same configuration and seed, same bits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace afd::plan {

enum class ExpertPlacementKind { contiguous, eplb };
const char* expert_placement_name(ExpertPlacementKind k);

// Distinct layer profiles at most; layer l of a deeper model uses profile l % n_profiles.
constexpr int64_t kMaxExpertProfiles = 64;
// (token, expert) pairs of the Monte-Carlo estimate of the true shares (2^20 tokens at top-8).
constexpr int64_t kTruthPairs = int64_t{1} << 23;
// Most (token, expert) pairs sampled per layer for a plan: window_tokens * top_k.
constexpr int64_t kMaxWindowPairs = int64_t{1} << 22;

struct ExpertLoadConfig {
  int64_t n_experts = 0;  // E routed experts per MoE layer; 0: off (the FFN workers share tokens evenly)
  int64_t top_k = 8;      // distinct experts per token, in [1, E]
  double zipf_s = 1.0;    // popularity exponent s in [0, 8]; 0: uniform
  ExpertPlacementKind placement = ExpertPlacementKind::contiguous;
  int64_t redundant = 0;          // R extra replicas per layer (eplb only); (E + R) % y == 0
  int64_t window_tokens = 65536;  // tokens sampled per layer to count before planning (eplb), in [1, 1e6]
                                  // with window_tokens * top_k <= kMaxWindowPairs
  bool enabled() const { return n_experts != 0; }
  // For y = n_ffn workers: E in [1, 4096], top_k, s and window in range, R = 0 unless eplb,
  // E >= y for contiguous, check_eplb_options for eplb. invalid_argument naming the field.
  Status validate(int64_t n_ffn) const;
};

// Each popularity rank's share of (token, expert) pairs when every one of n_tokens tokens picks
// top_k distinct experts: [n_experts], summing to 1. Preconditions: 1 <= top_k <= n_experts,
// n_tokens >= 1, zipf_s finite and >= 0.
std::vector<double> topk_rank_shares(int64_t n_experts, int64_t top_k, double zipf_s, int64_t n_tokens, uint64_t seed);

struct ExpertImbalance {
  std::vector<double> profile_max_over_mean;  // [min(n_layers, kMaxExpertProfiles)]
  double mean = 1.0;                          // over the n_layers layers (layer l: profile l % n_profiles)
  double max = 1.0;
};

// The FFN max/mean load of every layer profile for y = n_ffn workers (see the model above).
// invalid_argument when c.validate(n_ffn) fails or n_layers < 1; with the model off, one
// profile of 1.
Result<ExpertImbalance> expert_imbalance(const ExpertLoadConfig& c, int64_t n_ffn, int64_t n_layers, uint64_t seed);

}  // namespace afd::plan
