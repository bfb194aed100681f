// ChildProcesses: worker processes started by this one (`--spawn-ffn`, `--spawn-workers`).
// Each child gets default signal handling and SIGTERM if this process dies (PR_SET_PDEATHSIG);
// the destructor stops them all (SIGTERM, then SIGKILL after 5 s) and reaps them. watch()
// logs a child that exits on its own and, with a RestartPolicy, starts it again with the
// same arguments (same ports: its peers reconnect to it as they do after any loss); a child
// it will not start again is "lost" (lost(), ChildState::lost, the on_lost hook).
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

// Restarting children that exit on their own. The delay before a restart reflects how
// stable the child was lately: it doubles at each exit and halves for every half_life_ms
// the child ran before that exit (continuously: delay = prev * 2 * 2^(-uptime/half_life)),
// clamped to [backoff_ms, max_backoff_ms]. A child that keeps dying at start-up backs off
// quickly towards max_backoff_ms; one that dies every half_life_ms keeps its delay; one that
// runs longer earns it back down (no cliff at any one uptime). Independently of the delay,
// at most max_per_minute restarts happen in any 60 s: the exit that would exceed that
// leaves the child down for good ("restarts exhausted"), as does any exit with
// max_per_minute = 0.
struct RestartPolicy {
  int max_per_minute = 0;  // 0: never restart
  int backoff_ms = 500;
  int max_backoff_ms = 10000;
  int half_life_ms = 10000;
};

struct RestartDecision {
  bool restart = false;  // false: restarts are exhausted (or off)
  int delay_ms = 0;      // with restart
};

// The policy as a pure function: what to do about a child that exited after running
// uptime_ms, whose previous restart waited prev_delay_ms (0: never restarted yet), and which
// was restarted restarts_last_minute times in the 60 s before this exit.
RestartDecision plan_restart(const RestartPolicy& p, int prev_delay_ms, int64_t uptime_ms, int restarts_last_minute);

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
  // deployment whose workers cannot start should fail, not retry forever. A child that exits
  // after that and is not started again (its restarts are exhausted or off, or it cannot be
  // started) is lost: logged once (error), and on_lost(why) runs once for it on the watcher
  // thread (which holds this object's lock: the hook must not call back into it).
  void watch(RestartPolicy policy = {}, std::function<void(const std::string&)> on_startup_failure = {},
             std::function<void(const std::string&)> on_lost = {});
  // The bundle came up once: from now on, exits are restarted (policy).
  void mark_ready() { ready_ = true; }
  // Per child (by name): times it exited on its own, times it was restarted, whether it is
  // running now, and whether it is lost (with why). Thread-safe.
  struct ChildState {
    std::string name;
    int exits = 0, restarts = 0;
    bool running = false;
    bool lost = false;
    std::string lost_why;
  };
  std::vector<ChildState> states();
  // Why the lost children will not run again ("; "-joined), "" while none is. Thread-safe.
  std::string lost();
  // Stops and reaps every child; idempotent.
  void stop_all();
  // Stops the running child called `name` for good (SIGTERM, then SIGKILL after 5 s; reaped;
  // never restarted, not lost, no longer listed by states()): a worker the deployment no
  // longer needs. not_found if no child of that name is running or due to restart.
  // Thread-safe; waits for the child outside the lock.
  Status stop(const std::string& name);
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
    int delay_ms = 0;  // of the last restart (plan_restart's prev_delay_ms)
    int exits = 0, restarts_total = 0;
    bool lost = false;
    std::string lost_why;
    bool retired = false;  // stopped by stop(): not watched, restarted or listed
  };
  Result<pid_t> start(const std::vector<std::string>& args, const std::string& name, int life);
  void on_exit(Child& c, int status, const RestartPolicy& policy);  // mu_ held
  void lose(Child& c, const std::string& why);                       // mu_ held
  std::mutex mu_;
  std::vector<Child> children_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> ready_{false};
  std::function<void(const std::string&)> on_startup_failure_;
  std::function<void(const std::string&)> on_lost_;
  bool startup_failed_ = false;  // mu_
  bool warned_replaced_ = false;  // mu_ (start): logged that this executable was replaced on disk
  std::thread watcher_;
  std::vector<int> reserved_fds_;  // mu_ (reserve_port); closed by the destructor
};

}  // namespace afd::cli
