// The A/F-ratio controller of a self-balancing deployment: from the stage times a deployment
// measures over a window, the A/F ratio theory's optimum r* for the load of that window, and
// the worker counts to move to. No clock, no I/O: the simulator (`afd sim --autoscale`,
// plan/sim_autoscale.h) drives it window by window.
//
// The model is the A/F ratio paper's (§3.2, Theorem 4.4, plan/ratio_theory.h): t_A(T) for an
// attention micro-batch at token load T, t_C(B) for its A->F->A round trip, t_F(n) = α_F n + β_F
// for an FFN execution of n tokens per FFN instance, with n = r B. A window measures t_A and t_C
// at the window's own load directly; α_F and β_F are fitted by least squares to the (n, t_F)
// pairs of the windows since the FFN last changed speed (a window whose t_F is more than
// `refit_tolerance` off a fit over two or more n starts the fit over: a load change). With a
// single n the fit takes β_F = 0 (t_F proportional to n), so the first move can miss; the
// window after it adds a second n and the fit becomes exact for a linear t_F (with
// fit_ffn_fixed_cost = false, β_F = 0 and α_F = t_F / n of the window itself). Then
//     r_A = (t_A - β_F) / (α_F B),  r_C = (t_C - β_F) / (α_F B),  r_peak = sqrt(β_F / (α_F B)),
//     r* = max(r_A, r_C, r_peak)   (eq. 15, 16, 18, 19).
// The deployment moves when |r*/r - 1| > hysteresis: to the FFN count y' = round(x / r*) within
// its bounds, or, when that leaves y unchanged, the attention count x' = round(r* y). A window
// with no FFN or attention work changes nothing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace afd::plan {

struct AutoscaleBounds {
  int64_t min_attn = 1, max_attn = 64;
  int64_t min_ffn = 1, max_ffn = 64;
  Status validate() const;  // 1 <= min <= max <= 4096 on each side
};

struct AutoscaleOptions {
  AutoscaleBounds bounds;
  double hysteresis = 0.15;       // act when |r*/r - 1| exceeds it; in [0.01, 1]
  double refit_tolerance = 0.10;  // a t_F this far (relative) off the fit starts it over; in (0, 1]
  // false: β_F = 0 always (t_F = α_F n, α_F from the latest window alone; r* = r_A or r_C, the
  // ratio of per-token costs). For measurements too noisy for an intercept: two windows a few
  // percent off each other at nearby n give a β_F that sends r_peak anywhere.
  bool fit_ffn_fixed_cost = true;
  Status validate() const;
};

// One window's measurements: the counts it ran with and per decode step the means of an
// attention micro-batch's time and active requests (B), of its A->F->A transfer time (0: not
// measured), and of an FFN execution's time and tokens per FFN instance (n). Times in one unit.
struct StageWindow {
  int64_t n_attn = 1, n_ffn = 1;
  double attn_time = 0, batch = 0;
  double comm_time = 0;
  double ffn_time = 0, ffn_tokens = 0;
};

// What a running deployment exports that a window is read from: cumulative counters summed
// over its workers at one instant (afd serve --autoscale reads them from the workers'
// /metrics). Every attention micro-batch of every layer sends one frame, with all its tokens,
// to every FFN worker of the assignment, and each FFN worker counts the frames and tokens it
// served and the batches (frames of one layer and micro-batch step, aggregated over attention
// workers) it computed.
struct StageCounters {
  double attention_s = 0;  // attention workers: afd_stage_seconds_total{stage="attention"}
  double ffn_s = 0;        // FFN workers: afd_ffn_compute_seconds_total
  double ffn_batches = 0;  // afd_ffn_batches_total
  double ffn_frames = 0;   // afd_ffn_frames_total
  double ffn_tokens = 0;   // afd_ffn_tokens_total
};

// The window between two readings of the same n_attn attention and n_ffn FFN workers, in the
// controller's units: per attention micro-batch of one layer (a frame, as each FFN worker
// sees it), attn_time = attention seconds / frames per FFN worker and batch = tokens / frames;
// per FFN execution (a batch), ffn_time = FFN seconds / batches and ffn_tokens = the tokens of
// a batch (frames per batch × batch) over n_ffn (its share of the expert work: with every
// attention worker's frames in each batch, r·B as the theory has it); comm_time is 0 (not
// measured). A window without frames or batches has all zero (no work: no decision).
// invalid_argument for counters that went down (a worker restarted: skip the window) or
// are not finite, or counts < 1.
Result<StageWindow> stage_window(const StageCounters& before, const StageCounters& after, int64_t n_attn,
                                 int64_t n_ffn);

struct AutoscaleDecision {
  bool change = false;
  int64_t n_attn = 1, n_ffn = 1;  // the counts to run with next (the window's when !change)
  double ratio = 0;               // r of the window
  double r_star = 0;              // the optimum for the window's load (0: the window could not be read)
  double ffn_alpha = 0, ffn_beta = 0;  // the fit it used
  std::string reason;             // the numbers that made it, in words
};

class AutoscaleController {
 public:
  explicit AutoscaleController(AutoscaleOptions o) : opt_(std::move(o)) {}
  // The decision for the next window. invalid_argument for bad options, counts outside the
  // bounds, or negative / non-finite measurements.
  Result<AutoscaleDecision> decide(const StageWindow& w);

 private:
  AutoscaleOptions opt_;
  std::vector<std::pair<double, double>> ffn_samples_;  // (n, t_F) since the last refit
};

}  // namespace afd::plan
