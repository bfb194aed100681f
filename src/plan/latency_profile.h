// LatencyProfile: the linear latency models of the A/F ratio paper, §3.2, t_A(T) = α_A T + β_A,
// t_F(n) = α_F n + β_F, t_C(B) = α_C B + β_C, in one time unit, with how they were
// obtained. Stored as JSON (docs/PLANNING.md "Latency profile format"):
//   { "format": "afd-latency-profile", "version": 1, "time_unit": "s" | "cycles" | ...,
//     "attention": {"alpha": .., "beta": .., "fit": {...}},   // per token of load T
//     "ffn":       {"alpha": .., "beta": .., "fit": {...}},   // per token in the FFN batch
//     "comm":      {"alpha": .., "beta": .., "fit": {...}},   // per request, round trip
//     "source": "..." }
// "fit" (optional) carries n, r2, rmse, max_abs_residual of the least-squares fit.
#pragma once

#include <optional>
#include <string>

#include "core/status.h"

namespace afd::plan {

struct LinearFitQuality {
  int64_t n = 0;
  double r2 = 0;
  double rmse = 0;
  double max_abs_residual = 0;
};

struct LinearModel {
  double alpha = 0;  // time per unit of x
  double beta = 0;   // fixed time
  std::optional<LinearFitQuality> fit;
  double at(double x) const { return alpha * x + beta; }
};

struct LatencyProfile {
  std::string time_unit = "cycles";
  LinearModel attention;  // x = token load T of one attention micro-batch
  LinearModel ffn;        // x = tokens in the FFN batch
  LinearModel comm;       // x = requests in one attention micro-batch (A->F->A round trip)
  std::string source;
  Status validate() const;
};

// A/F ratio paper, Table 2 / Table 4 (DeepSeek-V3 on Ascend 910C, cycles).
LatencyProfile af_ratio_paper_profile();

std::string profile_to_json(const LatencyProfile& p);
Result<LatencyProfile> parse_profile_json(const std::string& text, const std::string& source);
Result<LatencyProfile> load_profile_file(const std::string& path);
Status save_profile_file(const LatencyProfile& p, const std::string& path);

}  // namespace afd::plan
