// ChildProcesses: worker processes started by this one (`--spawn-ffn`, `--spawn-workers`).
// Each child gets default signal handling and SIGTERM if this process dies (PR_SET_PDEATHSIG);
// the destructor stops them all (SIGTERM, then SIGKILL after 5 s) and reaps them. watch()
// logs a child that exits on its own and, with a RestartPolicy, starts it again with the
// same arguments (same ports: its peers reconnect to it as they do after any loss).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace afd::cli {

// Restarting children that exit on their own: after backoff_ms (doubling, up to
// max_backoff_ms, while it keeps dying within a minute of starting), at most max_per_minute
// times in any 60 s; past that the child is left down (logged).
struct RestartPolicy {
  int max_per_minute = 0;  // 0: never restart
  int backoff_ms = 500;
  int max_backoff_ms = 10000;
};

class ChildProcesses {
 public:
  ChildProcesses() = default;
  ~ChildProcesses();
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;

  // Runs this executable with args (args[0] is not the program: it is the first argument);
  // `name` is used in logs. kLifeToken inside an argument is replaced by the life of the
  // process: 0 for this start, 1 for its first restart, ... (so each life can, e.g., write
  // its own file).
  Result<pid_t> spawn_self(const std::vector<std::string>& args, const std::string& name);
  static constexpr const char* kLifeToken = "{life}";
  // Starts a thread that logs (error) any child exiting before stop_all() and restarts it
  // as `policy` says. With on_startup_failure: a child that exits before mark_ready() is
  // not restarted; on_startup_failure(why) runs once (on the watcher thread) instead — a
  // deployment whose workers cannot start should fail, not retry forever.
  void watch(RestartPolicy policy = {}, std::function<void(const std::string&)> on_startup_failure = {});
  // The bundle came up once: from now on, exits are restarted (policy).
  void mark_ready() { ready_ = true; }
  // Per child (by name): times it exited on its own, times it was restarted, and whether it
  // is running now. Thread-safe.
  struct ChildState {
    std::string name;
    int exits = 0, restarts = 0;
    bool running = false;
  };
  std::vector<ChildState> states();
  // Stops and reaps every child; idempotent.
  void stop_all();
  size_t size() const { return children_.size(); }
  // A free TCP port on 127.0.0.1 for a child to listen on, held until this object is
  // destroyed (after its children are stopped) by a socket bound to it with SO_REUSEADDR that
  // never listens. Meanwhile nothing else takes the port — neither a bind() without
  // SO_REUSEADDR nor the kernel's pick of a source port for a connection, which skips bound
  // ports — while the child, whose listeners set SO_REUSEADDR, binds and listens on it, at
  // start and after any restart (a second listener is refused as usual; only another
  // SO_REUSEADDR socket could bind it, and listen, while no child does). A port merely found
  // free and released was taken, once in a test run, by another process before the child
  // bound it: the child failed to start and so did the bundle.
  Result<int> reserve_port();

 private:
  struct Child {
    pid_t pid = -1;
    std::string name;
    bool reaped = false;
    std::vector<std::string> args;
    std::chrono::steady_clock::time_point started;
    std::vector<std::chrono::steady_clock::time_point> restarts;  // within the last minute
    std::chrono::steady_clock::time_point restart_at{};            // pending restart (reaped, not given up)
    bool pending = false;
    int backoff_ms = 0;
    int exits = 0, restarts_total = 0;
  };
  Result<pid_t> start(const std::vector<std::string>& args, const std::string& name, int life);
  void on_exit(Child& c, int status, const RestartPolicy& policy);  // mu_ held
  std::mutex mu_;
  std::vector<Child> children_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> ready_{false};
  std::function<void(const std::string&)> on_startup_failure_;
  bool startup_failed_ = false;  // mu_
  bool warned_replaced_ = false;  // mu_ (start): logged that this executable was replaced on disk
  std::thread watcher_;
  std::vector<int> reserved_fds_;  // mu_ (reserve_port); closed by the destructor
};

}  // namespace afd::cli
