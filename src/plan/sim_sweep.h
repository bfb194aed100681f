// A sweep of the simulator over A/F ratios with the theory beside each point, as in
// A/F ratio paper, Figures 4-5. Ratios are given as "r" (r A - 1 F; a fraction such as 3.5 becomes
// 7A-2F) or "x:y" (x A - y F).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "plan/ratio_theory.h"
#include "plan/simulator.h"

namespace afd::plan {

struct RatioSpec {
  int64_t n_attn = 1, n_ffn = 1;
  double ratio() const { return static_cast<double>(n_attn) / static_cast<double>(n_ffn); }
};
Result<RatioSpec> parse_ratio_spec(const std::string& s);

// Theory at ratio r for the simulator's configuration: eq. (5)/(6) with T̄(B; N), idle
// ratios 1 - t̄/τ, and TPOT = n_microbatches * max(τ, (t̄_A + t̄_C + t̄_F)/n_microbatches)
// (each request advances once per round of its instance's micro-batches).
struct TheoryPoint {
  double ratio = 0;
  double cycle = 0;                 // τ of eq. (5)
  double pipelined_cycle = 0;       // max(τ, (t̄_A + t̄_C + t̄_F) / n_microbatches)
  double pipelined_throughput = 0;  // eq. (6) with pipelined_cycle
  double throughput_per_instance = 0;
  double eta_attn = 0, eta_ffn = 0;
  double tpot = 0;
};
RatioWorkload workload_of(const SimConfig& c);
TheoryPoint theory_point(const SimConfig& c, double ratio);
// The ratio maximising pipelined_throughput (a scan with step 1e-3 up to 4 r* + 4): unlike
// r* (eq. 19), it accounts for a micro-batch's own A -> C -> F -> C loop, which the
// n_microbatches in flight must cover; with 2 micro-batches and t_C on the loop, the
// balanced point r_A is not fully overlapped and the optimum moves below it.
double pipelined_optimal_ratio(const SimConfig& c);

struct SweepPoint {
  RatioSpec spec;
  SimResult sim;
  TheoryPoint theory;
};
// Runs base with each ratio (seed unchanged: common random numbers across ratios). With a
// pool, runs in parallel; results are identical either way.
Result<std::vector<SweepPoint>> run_ratio_sweep(const SimConfig& base, const std::vector<RatioSpec>& ratios,
                                                ThreadPool* pool);

}  // namespace afd::plan
