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
// window after it adds a second n and the fit becomes exact for a linear t_F. Then
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
