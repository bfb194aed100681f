// Emulated stage costs (EmulationOptions::stage_costs_file, --emulate-stage-costs FILE): for
// tests and benchmarks of what depends on the ratio of attention to FFN time (the autoscaler,
// docs/DEPLOYMENT.md "Autoscaling") on a machine whose real stage times are too small or too
// noisy. An attention engine sleeps attention_us_per_token × tokens after each micro-batch's
// attention of a layer; an FFN worker sleeps ffn_us_per_row × (token, routed expert) pairs it
// computed + ffn_us_per_batch after each batch. Both sleeps lie inside the time the side
// reports as its stage (afd_stage_seconds_total{stage="attention"},
// afd_ffn_compute_seconds_total), so the deployment measures and behaves as one whose stages
// cost that much more.
//
// The file is JSON {"attention_us_per_token": a, "ffn_us_per_row": f, "ffn_us_per_batch": b},
// each optional (0), a number in [0, 1e6]. It is re-read when its modification time or size
// changes, checked at most every 100 ms, so a test can slow a stage while the deployment runs.
// A file that cannot be read or does not parse keeps the last good values; the reason is
// logged once per change of the file.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"

namespace afd {

struct StageCosts {
  double attention_us_per_token = 0;
  double ffn_us_per_row = 0;
  double ffn_us_per_batch = 0;
};

// The costs in `text` (the file's JSON); `source` names it in errors.
Result<StageCosts> parse_stage_costs(const std::string& text, const std::string& source);

class StageCostEmulation {
 public:
  // Reads `path` once now: an error if it cannot be read or parsed (a typo should fail at start).
  static Result<std::shared_ptr<StageCostEmulation>> open(const std::string& path);

  // The costs now (re-reading the file when it changed). Thread-safe.
  StageCosts current();
  // Sleep as the attention side / the FFN side emulates (no-op at cost 0). Thread-safe.
  void attention(int64_t tokens);
  void ffn(int64_t expert_rows);

 private:
  explicit StageCostEmulation(std::string path) : path_(std::move(path)) {}
  Status reload();  // mu_ held

  std::string path_;
  std::mutex mu_;
  StageCosts costs_;
  int64_t checked_ns_ = 0;
  int64_t mtime_ns_ = -1, size_ = -1;
  std::string last_error_;  // of the last check ("" if it read the file); logged when it changes
};

}  // namespace afd
