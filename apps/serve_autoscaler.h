// ServeAutoscaler: `afd serve --autoscale` on a spawned xAyF deployment (docs/DEPLOYMENT.md
// "Autoscaling"). Every interval it reads the workers' cumulative stage counters from their
// /metrics (plan::StageCounters: attention seconds from each attention worker, compute
// seconds, batches, frames and tokens from each FFN worker), turns the difference from the
// last reading into a window (plan::stage_window) and asks plan::AutoscaleController for the
// worker counts. A change is carried out through the paths an operator would use:
//   - an FFN worker is added by starting it (its own shard index, a new name) and, once its
//     /metrics answers, POST /admin/ffn {"add"} through the front end (every attention worker
//     takes it at its next step); one is removed by POST /admin/ffn {"remove"}, then stopped
//     once it has served no frame for a second (the attention workers moved off it);
//   - an attention worker is added by starting it with the current FFN members and
//     /admin/attention {"add"} (placed on once its /health passes); one is removed by
//     /admin/attention {"remove"} (draining: its requests finish there), then stopped once
//     the front end has removed it.
// The newest workers go first. A change is carried out only when two windows in a row ask for
// the same counts (a window in which the load changed mixes two regimes). The window in which a
// change happened is not read (the next reading starts a fresh one), nor is one where a worker
// could not be read. The FFN model is proportional (plan::AutoscaleOptions::fit_ffn_fixed_cost
// = false): r* is the ratio of the window's per-token attention and FFN costs. Every decision is
// logged with the numbers that made it (plan::AutoscaleDecision::reason) and the state is in
// /metrics (render_metrics(): afd_autoscale_*).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_processes.h"
#include "core/status.h"
#include "plan/autoscale.h"
#include "serve/metrics/metrics_federation.h"

namespace afd::serve {
class Frontend;
}

namespace afd::cli {

struct AutoscaleSettings {
  plan::AutoscaleOptions controller;  // bounds, hysteresis
  double interval_s = 10;             // one window
  int scrape_timeout_ms = 2000;
  int ffn_ready_timeout_ms = 120000;  // a started FFN worker's /metrics must answer within it
  int drain_timeout_ms = 600000;      // a removed attention worker must be drained within it
};

// The settings are valid and a deployment of x attention and y FFN workers lies within the
// bounds (invalid_argument naming the flags otherwise).
Status check_autoscale_start(const AutoscaleSettings& s, int64_t x, int64_t y);

// A worker the autoscaler knows: the child process's name (ChildProcesses), its data address
// (host:port), and for an FFN worker its GET /metrics.
struct ScaledWorker {
  std::string name, address;
  int index = 0;  // attention index / FFN shard index
  serve::MetricsTarget metrics;
};

// How the launcher starts one more worker (a child process of `children`).
struct WorkerStarters {
  // An attention worker with attention index `index` dialing the FFN workers `ffn` (in slot order).
  std::function<Result<ScaledWorker>(int index, const std::vector<std::string>& ffn)> attention;
  // An FFN worker with shard index `index` (with a --metrics-listen port).
  std::function<Result<ScaledWorker>(int index)> ffn;
};

class ServeAutoscaler {
 public:
  // The deployment at start: its attention and FFN workers (every FFN worker with metrics).
  // invalid_argument if the settings are invalid or the counts lie outside the bounds.
  static Result<std::unique_ptr<ServeAutoscaler>> create(AutoscaleSettings s, std::vector<ScaledWorker> attention,
                                                         std::vector<ScaledWorker> ffn, ChildProcesses* children,
                                                         WorkerStarters start);
  ~ServeAutoscaler();
  // Starts the loop over `frontend` (which outlives stop()).
  void start(serve::Frontend* frontend);
  // Ends the loop (interrupting a wait); idempotent.
  void stop();
  // afd_autoscale_* (Prometheus text). Thread-safe.
  std::string render_metrics() const;

 private:
  ServeAutoscaler() = default;
  void loop();
  // The counters now, summed over every worker; an error if one could not be read.
  Result<plan::StageCounters> read_counters() const;
  Status apply(const plan::AutoscaleDecision& d);
  Status add_ffn();
  Status remove_ffn();
  Status add_attention();
  Status remove_attention();
  void publish_ffn_targets();
  // Sleeps up to ms; false when stop() was called.
  bool wait_ms(int64_t ms);
  std::vector<std::string> ffn_addresses() const;  // mu_ held

  AutoscaleSettings s_;
  ChildProcesses* children_ = nullptr;
  WorkerStarters start_;
  serve::Frontend* frontend_ = nullptr;
  std::unique_ptr<plan::AutoscaleController> controller_;

  mutable std::mutex mu_;  // the lists and the numbers below
  std::vector<ScaledWorker> attention_, ffn_;
  int next_attention_index_ = 0, next_ffn_index_ = 0;
  uint64_t windows_ = 0, changes_ = 0, errors_ = 0, skipped_ = 0;
  bool changing_ = false;  // apply() running
  std::optional<std::pair<int64_t, int64_t>> pending_;  // (x, y) the last window asked for (loop thread)
  plan::StageWindow last_window_;
  plan::AutoscaleDecision last_decision_;

  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace afd::cli
