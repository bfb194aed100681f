// LocalFfnProcesses: `--spawn-ffn` — starts the y FFN workers of an xAyF topology as child
// processes of this one (`afd worker --role ffn` over UCX on 127.0.0.1) and points the
// engine options at them, so one command runs a multi-process bundle. The children are
// stopped (SIGTERM, then SIGKILL after 5 s) when the object is destroyed.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "engine_flags.h"

namespace afd::cli {

class LocalFfnProcesses {
 public:
  LocalFfnProcesses() = default;
  ~LocalFfnProcesses();
  LocalFfnProcesses(const LocalFfnProcesses&) = delete;
  LocalFfnProcesses& operator=(const LocalFfnProcesses&) = delete;

  // No-op unless flags.spawn_ffn. Otherwise spawns the workers, fills o->ffn_addresses and
  // hosts all x attention workers here (o->local_attention = x).
  Status start(const EngineFlags& flags, EngineOptions* o);

 private:
  std::vector<pid_t> children_;
};

}  // namespace afd::cli
