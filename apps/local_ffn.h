// LocalFfnProcesses: `--spawn-ffn` — starts the y FFN workers of an xAyF topology as child
// processes of this one (`afd worker --role ffn` over UCX on 127.0.0.1) and points the
// engine options at them, so one command runs a multi-process bundle. The children are
// stopped (SIGTERM, then SIGKILL after 5 s) when the object is destroyed.
#pragma once

#include <string>
#include <vector>

#include "child_processes.h"
#include "engine_flags.h"

namespace afd::cli {

// Spawns the y FFN workers of topology t (xAyF) as children on free 127.0.0.1 ports; returns
// their addresses in shard order. threads > 0 is passed to each worker; ffn_tp > 1 (dividing
// n_ffn) makes them TP ranks of y/ffn_tp EP groups (--ffn-tp).
Result<std::vector<std::string>> spawn_ffn_workers(ChildProcesses* children, int n_attention, int n_ffn,
                                                   const std::string& model_dir, const std::string& precision,
                                                   int threads, int ffn_tp = 1, int ucx_spin_us = -1);

class LocalFfnProcesses {
 public:
  // No-op unless flags.spawn_ffn. Otherwise spawns the workers, fills o->ffn_addresses and
  // hosts all x attention workers here (o->local_attention = x).
  Status start(const EngineFlags& flags, EngineOptions* o);

 private:
  ChildProcesses children_;
};

}  // namespace afd::cli
