// The A/F ratio theory of the A/F ratio paper, §4: horizon-average token load (Lemma 4.1,
// Definition 4.2, Proposition 4.3), the three regimes and the closed-form optimal ratio r*
// (Theorem 4.4) with its throughput per instance (eq. 6, 20).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "plan/latency_profile.h"

namespace afd::plan {

struct RatioWorkload {
  int64_t batch = 256;      // B: requests per attention micro-batch
  double mu_prefill = 100;  // μ_P
  double mu_decode = 500;   // μ_D = (1-p)/p
  std::optional<int64_t> n_requests;  // N per attention instance; unset = N -> infinity
  double p() const { return 1.0 / (1.0 + mu_decode); }
};

// E[T_k] of eq. (11).
double expected_token_load(const RatioWorkload& w, double k);
// T̄(B; N) of Definition 4.2, summed in closed form (Appendix A.2) with K(B) = N/(Bp);
// the N -> infinity limit B(μ_P + μ_D) of eq. (14) when n_requests is unset.
double horizon_avg_token_load(const RatioWorkload& w);

enum class Regime { attention_bound, comm_bound, ffn_bound };
const char* regime_name(Regime r);

struct RatioResult {
  double t_bar = 0;          // T̄
  double t_attn = 0;         // t̄_A
  double t_comm = 0;         // t̄_C
  double r_attn = 0;         // r_A, eq. (15)
  double r_comm = 0;         // r_C, eq. (16)
  double r_peak = 0;         // eq. (18)
  double r_star = 0;         // eq. (19)
  Regime regime = Regime::attention_bound;  // which term of (19) attains the max
  double throughput_star = 0;  // eq. (20), tokens per time unit per instance
};
RatioResult optimal_ratio(const LatencyProfile& lat, const RatioWorkload& w);

// Cycle time τ(B; r) (eq. 5) and throughput per instance (eq. 6) at T̄.
double cycle_time(const LatencyProfile& lat, const RatioWorkload& w, double r);
double throughput_per_instance(const LatencyProfile& lat, const RatioWorkload& w, double r);

}  // namespace afd::plan
