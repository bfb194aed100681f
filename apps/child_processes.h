// ChildProcesses: worker processes started by this one (`--spawn-ffn`, `--spawn-workers`).
// Each child gets default signal handling and SIGTERM if this process dies (PR_SET_PDEATHSIG);
// the destructor stops them all (SIGTERM, then SIGKILL after 5 s) and reaps them. watch()
// logs a child that exits on its own.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace afd::cli {

class ChildProcesses {
 public:
  ChildProcesses() = default;
  ~ChildProcesses();
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;

  // Runs this executable with args (args[0] is not the program: it is the first argument);
  // `name` is used in logs.
  Result<pid_t> spawn_self(const std::vector<std::string>& args, const std::string& name);
  // Starts a thread that logs (error) any child exiting before stop_all().
  void watch();
  // Stops and reaps every child; idempotent.
  void stop_all();
  size_t size() const { return children_.size(); }

 private:
  struct Child {
    pid_t pid = -1;
    std::string name;
    bool reaped = false;
  };
  std::mutex mu_;
  std::vector<Child> children_;
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
};

// A currently free TCP port on 127.0.0.1 (the OS picks; another process could take it
// before the child binds — the child then fails with a clear error).
Result<int> free_local_port();

}  // namespace afd::cli
