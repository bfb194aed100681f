// ReloadOnHangup: runs an action (the front end's topology file reload) on every SIGHUP, on a
// thread of its own (the handler only writes to a pipe). Installed by `afd serve
// --topology-file F` without --spawn-workers; elsewhere SIGHUP keeps its default action.
#pragma once

#include <functional>
#include <memory>
#include <thread>

#include "core/status.h"

namespace afd::cli {

class ReloadOnHangup {
 public:
  // At most one at a time in the process.
  static Result<std::unique_ptr<ReloadOnHangup>> start(std::function<void()> action);
  // Restores SIGHUP's default action and joins the thread (an action running finishes first).
  ~ReloadOnHangup();

 private:
  ReloadOnHangup() = default;
  std::thread thread_;
};

}  // namespace afd::cli
