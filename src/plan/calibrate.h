// Calibration (the A/F ratio paper, Appendix B): fit the linear latency models t_A(T), t_F(n), t_C(B)
// by least squares to measured stage times, report fit quality, emit a LatencyProfile.
//
// Measurements come either from a CSV file (parse_samples_csv) or from a StageSampler that
// runs the engine's stages (run_calibration_sweep); the sampler is supplied by the caller
// so this module does not depend on the runtime.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "plan/latency_profile.h"

namespace afd::plan {

// One measured decode step of one attention micro-batch (seconds).
struct StageSample {
  int64_t batch = 0;       // requests in the attention micro-batch (x of t_C)
  int64_t token_load = 0;  // T = Σ context lengths of those requests (x of t_A)
  int64_t ffn_tokens = 0;  // tokens in the FFN batch (x of t_F); 0 = same as batch
  double attention_s = 0;  // attention stage, all layers
  double a2f_s = 0;        // A->F transfer, all layers
  double ffn_s = 0;        // FFN stage, all layers
  double f2a_s = 0;        // F->A transfer, all layers
};

// Measures one step at (batch, token_load): e.g. an engine wired A->F with `batch`
// sequences of token_load/batch tokens each, returning its StageTimes.
using StageSampler = std::function<Result<StageSample>(int64_t batch, int64_t token_load)>;

struct SweepSpec {
  std::vector<int64_t> batches{8, 16, 32, 64};
  std::vector<int64_t> contexts{256, 1024, 4096};  // per-request context; token_load = batch * context
  int repeats = 3;
};
// Calls the sampler for every (batch, context) repeats times, in that order.
Result<std::vector<StageSample>> run_calibration_sweep(const StageSampler& sampler, const SweepSpec& spec);

// CSV with a header row naming columns (any order; '#' lines are comments):
//   batch, token_load, attention_s, a2f_s, ffn_s, f2a_s   (required)
//   ffn_tokens                                             (optional; default = batch)
Result<std::vector<StageSample>> parse_samples_csv(const std::string& text, const std::string& source);
Result<std::vector<StageSample>> load_samples_csv(const std::string& path);

// Least squares y = alpha x + beta with alpha, beta >= 0 (when the unconstrained optimum has a
// negative coefficient, the best fit on the boundary is returned). Needs >= 2 distinct x.
// residuals (optional) receives y_i - (alpha x_i + beta).
Result<LinearModel> fit_linear(const std::vector<double>& x, const std::vector<double>& y,
                               std::vector<double>* residuals = nullptr);

struct CalibrationResult {
  LatencyProfile profile;  // time_unit "s"
  std::vector<double> attention_residuals, ffn_residuals, comm_residuals;
};
// attention: attention_s vs token_load; ffn: ffn_s vs ffn_tokens; comm: a2f_s + f2a_s vs batch.
Result<CalibrationResult> fit_profile(const std::vector<StageSample>& samples, const std::string& source);

}  // namespace afd::plan
