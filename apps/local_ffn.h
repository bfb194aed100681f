// LocalFfnProcesses: `--spawn-ffn` — starts the y FFN workers of an xAyF topology as child
// processes of this one (`afd worker --role ffn` over UCX on 127.0.0.1) and points the
// engine options at them, so one command runs a multi-process bundle. The children are
// stopped (SIGTERM, then SIGKILL after 5 s) when the object is destroyed.
#pragma once

#include <string>
#include <vector>

#include "child_processes.h"
#include "engine_flags.h"
#include "serve/metrics/metrics_federation.h"

namespace afd::cli {

struct SpawnedFfnWorker {
  std::string name;                // its ChildProcesses name ("FFN worker j/y")
  std::string address;             // what the attention workers dial
  serve::MetricsTarget metrics;    // its GET /metrics (with_metrics only)
  std::string trace_part;          // with e.trace: the trace file it writes when it stops
};

// Spawns FFN worker `index` (--shard index/n_ffn: the index names it on the wire) on a free
// 127.0.0.1 port, as spawn_ffn_workers does each of its workers.
Result<SpawnedFfnWorker> spawn_ffn_worker(ChildProcesses* children, int index, int n_ffn, int n_attention,
                                          const EngineFlags& e, int threads, bool with_metrics);

struct SpawnedFfn {
  std::vector<std::string> names;             // their ChildProcesses names, in shard order
  std::vector<std::string> addresses;         // what the attention workers dial, in shard order
  std::vector<serve::MetricsTarget> metrics;  // their GET /metrics (with_metrics only)
  std::vector<std::string> trace_parts;       // with e.trace: the trace file each writes when it stops
};

// Spawns the y FFN workers of topology t (xAyF) as children on free 127.0.0.1 ports. Each
// gets e's model, --precision, --ffn-tp (> 1: TP ranks of y/ffn_tp EP groups), --ucx-spin-us
// and --ffn-device; threads > 0 is passed as --threads; with_metrics: a --metrics-listen port;
// e.trace: --trace trace_part_path(e.trace, "ffn", j) and e's --trace-max-spans.
Result<SpawnedFfn> spawn_ffn_workers(ChildProcesses* children, int n_attention, int n_ffn, const EngineFlags& e,
                                     int threads, bool with_metrics);

class LocalFfnProcesses {
 public:
  // No-op unless flags.spawn_ffn. Otherwise spawns the workers, fills o->afd.ffn_addresses and
  // hosts all x attention workers here (o->afd.local_attention = x). with_metrics: each worker
  // also answers GET /metrics at one of metrics_targets().
  Status start(const EngineFlags& flags, EngineOptions* o, bool with_metrics = false);
  const std::vector<serve::MetricsTarget>& metrics_targets() const { return metrics_; }
  // The worker processes, for watching them (ChildProcesses::watch; run_engine_service's
  // ServiceExtras::children).
  ChildProcesses* children() { return &children_; }
  // With --trace: stops the workers (each writes its part as it stops) and merges their
  // parts into `path` after what this process wrote there. No-op without spawned traces.
  Status merge_traces(const char* cmd, const std::string& path);

 private:
  ChildProcesses children_;
  std::vector<serve::MetricsTarget> metrics_;
  std::vector<std::string> trace_parts_;
};

}  // namespace afd::cli
