// Serving metrics rendered as Prometheus text (GET /metrics). Thread-safe: counters are
// atomics, histograms and per-worker gauges take a mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace afd::serve {

// Prometheus text helpers: a sample value (%.9g), and the # HELP / # TYPE lines of a metric.
std::string prom_num(double v);
void prom_header(std::string* out, const char* name, const char* type, const char* help);
// afd_numerics_info{system_fingerprint="...",deterministic="0|1"} 1: what the numbers of this
// process's answers depend on (runtime/system_fingerprint.h).
std::string render_numerics_info(const std::string& system_fingerprint, bool deterministic);

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Appends the _bucket/_sum/_count lines for `name`.
  void render(const std::string& name, std::string* out) const;
  // Quantile estimate from the buckets (upper bound of the bucket holding it); 0 if empty.
  double quantile(double q) const;
  uint64_t count() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1] (last: +Inf)
  double sum_ = 0;
  uint64_t n_ = 0;
};

// Per attention worker (one scheduler + engine) state, updated by its scheduler thread.
struct WorkerStats {
  std::atomic<int64_t> queue_depth{0};
  std::atomic<int64_t> running{0};
  std::atomic<int64_t> token_load{0};     // KV tokens of running + prompt tokens of queued
  std::atomic<int64_t> kv_blocks_used{0};
  std::atomic<int64_t> kv_blocks_total{0};
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> preemptions{0};
  std::atomic<int64_t> step_retries{0};  // forward passes run again after a peer loss or stall
  // --speculative-max-batch auto: the governor's view per batch-size bucket
  // (SpeculationGovernor::bucket), published by the scheduler after each decode step it
  // measured: the side it runs (+1 drafts, -1 none, 0 still warming up) and the tokens per
  // second of the steps with and without drafts. spec_auto: whether the governor is in use.
  static constexpr int kSpecBuckets = 8;
  std::atomic<bool> spec_auto{false};
  std::atomic<int> spec_side[kSpecBuckets] = {};
  std::atomic<double> spec_rate_on[kSpecBuckets] = {}, spec_rate_off[kSpecBuckets] = {};
  // Accumulated seconds (under mu).
  std::mutex mu;
  StageTimes stage_sum;
  double busy_s = 0;   // inside engine forward
  double idle_s = 0;   // waiting for work
};

// Speculative decoding counters (afd_spec_decode_*; thread-safe): per verification item one
// record(drafts, accepted). Positions beyond kMaxPositions are counted in the totals only.
struct SpeculativeCounters {
  static constexpr int kMaxPositions = 8;
  std::atomic<int64_t> verifications{0}, draft_tokens{0}, accepted_tokens{0};
  std::atomic<int64_t> drafted_at[kMaxPositions] = {}, accepted_at[kMaxPositions] = {};
  void record(int64_t drafts, int64_t accepted);
  void render(std::string* o) const;
};

// Structured outputs (afd_structured_*; thread-safe): constrained requests admitted, and the
// token masks their grammars computed with the time it took (the cost constrained decoding
// adds to a step).
struct StructuredCounters {
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> masks{0};
  std::atomic<int64_t> mask_ns{0};
  void render(std::string* o) const;
};

class Metrics {
 public:
  explicit Metrics(int n_workers);
  WorkerStats& worker(int i) { return *workers_[i]; }
  int n_workers() const { return static_cast<int>(workers_.size()); }

  void request_finished(int http_status);   // every HTTP request to /v1/*
  std::atomic<int64_t> prompt_tokens{0};
  std::atomic<int64_t> generation_tokens{0};
  std::atomic<int64_t> requests_rejected{0};  // 429/503
  std::atomic<int64_t> requests_cancelled{0};
  // Prefix cache, in tokens (vLLM's prefix_cache_queries / prefix_cache_hits): per admission
  // (re-admissions after preemption included) the tokens looked up and those found cached.
  std::atomic<int64_t> prefix_cache_queries{0};
  std::atomic<int64_t> prefix_cache_hits{0};
  // Tokens run through the engine outside single-token decodes (prompt chunks and the
  // recompute after preemption): prompt tokens minus prefix-cache hits, plus recomputes.
  std::atomic<int64_t> prefill_tokens{0};
  SpeculativeCounters speculative;
  StructuredCounters structured;
  Histogram ttft;     // seconds, arrival -> first token
  Histogram tpot;     // seconds per output token after the first
  Histogram e2e;      // seconds, arrival -> last token

  std::string render() const;
  // Appends fn()'s Prometheus text to every render() (e.g. the in-process FFN workers'
  // afd_ffn_* series); fn must not repeat a family render() already has.
  void add_section(std::function<std::string()> fn);

 private:
  void render_speculation_auto(std::string* o) const;
  std::vector<std::function<std::string()>> sections_;  // under mu_
  std::vector<std::unique_ptr<WorkerStats>> workers_;
  mutable std::mutex mu_;
  std::vector<std::pair<int, int64_t>> status_counts_;  // (http status, count)
};

}  // namespace afd::serve
