#include "child_processes.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/log.h"

namespace afd::cli {

RestartDecision plan_restart(const RestartPolicy& p, int prev_delay_ms, int64_t uptime_ms, int restarts_last_minute) {
  if (p.max_per_minute <= 0 || restarts_last_minute >= p.max_per_minute) return {};
  const double lo = std::max(0, p.backoff_ms);
  const double hi = std::max(lo, static_cast<double>(p.max_backoff_ms));
  double d = lo;
  if (prev_delay_ms > 0 && p.half_life_ms > 0) {
    const double ran = static_cast<double>(std::max<int64_t>(0, uptime_ms));
    d = 2.0 * prev_delay_ms * std::exp2(-ran / p.half_life_ms);
  }
  return {true, static_cast<int>(std::lround(std::clamp(d, lo, hi)))};
}

Result<int> ChildProcesses::reserve_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return io_error("socket() failed");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return io_error("cannot find a free port on 127.0.0.1");
  }
  std::lock_guard<std::mutex> l(mu_);
  reserved_fds_.push_back(fd);
  return ntohs(a.sin_port);
}

Result<pid_t> ChildProcesses::start(const std::vector<std::string>& args, const std::string& name, int life) {
  // Children exec /proc/self/exe, i.e. the very file this process runs, not the path it was
  // started from: a rebuild or upgrade that replaces that path while the bundle serves
  // would otherwise leave a restart nothing to exec (the link then reads "... (deleted)").
  // So a bundle's restarted workers are always of the front end's own version.
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return io_error("cannot find this executable (/proc/self/exe)");
  exe[n] = '\0';
  std::string shown = exe;
  const std::string deleted = " (deleted)";
  if (shown.size() > deleted.size() && shown.ends_with(deleted)) {
    shown.resize(shown.size() - deleted.size());
    if (!warned_replaced_) {
      spdlog::warn("{} was replaced on disk: workers are restarted from the running version (restart the bundle to "
                   "run the new one)", shown);
      warned_replaced_ = true;
    }
  }
  std::vector<std::string> argv_s = {shown};
  for (std::string a : args) {
    const std::string token = kLifeToken;
    for (size_t at; (at = a.find(token)) != std::string::npos;) a.replace(at, token.size(), std::to_string(life));
    argv_s.push_back(std::move(a));
  }
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Written by the child if exec fails (only async-signal-safe calls after fork).
  const std::string exec_failed = "afd: cannot start " + name + ": exec of /proc/self/exe (" + shown + ") failed\n";
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return io_error("fork() failed starting " + name);
  if (pid == 0) {
    sigset_t none;  // the mask survives exec: give the worker default signal handling
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // (sent when the forking *thread* ends: see stop_all)
    if (getppid() != parent) _exit(1);  // the parent died before prctl
    execv("/proc/self/exe", argv.data());
    ssize_t w = write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    (void)w;
    _exit(127);
  }
  return pid;
}

Result<pid_t> ChildProcesses::spawn_self(const std::vector<std::string>& args, const std::string& name) {
  std::lock_guard<std::mutex> l(mu_);
  AFD_ASSIGN_OR_RETURN(pid_t pid, start(args, name, 0));
  Child c;
  c.pid = pid;
  c.name = name;
  c.args = args;
  c.started = std::chrono::steady_clock::now();
  children_.push_back(std::move(c));
  return pid;
}

void ChildProcesses::on_exit(Child& c, int st, const RestartPolicy& policy) {
  using clock = std::chrono::steady_clock;
  c.reaped = true;
  if (stopping_) return;
  ++c.exits;
  const std::string what = c.name + " (process " + std::to_string(c.pid) + ") exited (" +
                           (WIFSIGNALED(st) ? "signal " + std::to_string(WTERMSIG(st))
                                            : "status " + std::to_string(WEXITSTATUS(st))) + ")";
  if (on_startup_failure_ && !ready_) {
    spdlog::error("{}", what);
    if (!startup_failed_) on_startup_failure_(what + " before the bundle came up (its error is logged above)");
    startup_failed_ = true;
    return;
  }
  const auto now = clock::now();
  std::erase_if(c.restarts, [&](clock::time_point t) { return now - t > std::chrono::minutes(1); });
  const int64_t uptime_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - c.started).count();
  const RestartDecision d = plan_restart(policy, c.delay_ms, uptime_ms, static_cast<int>(c.restarts.size()));
  if (!d.restart) {
    lose(c, what + " and is not restarted: " +
                (policy.max_per_minute <= 0
                     ? std::string("restarts are off")
                     : "restarts exhausted (restarted " + std::to_string(c.restarts.size()) +
                           (c.restarts.size() == 1 ? " time" : " times") + " in the last minute, the limit)"));
    return;
  }
  c.delay_ms = d.delay_ms;
  c.pending = true;
  c.restart_at = now + std::chrono::milliseconds(d.delay_ms);
  spdlog::error("{} after running {:.1f} s: restarting it in {} ms", what, static_cast<double>(uptime_ms) * 1e-3,
                d.delay_ms);
}

void ChildProcesses::lose(Child& c, const std::string& why) {
  if (c.lost) return;
  c.lost = true;
  c.lost_why = why;
  spdlog::error("{}", why);
  if (on_lost_) on_lost_(why);
}

void ChildProcesses::watch(RestartPolicy policy, std::function<void(const std::string&)> on_startup_failure,
                           std::function<void(const std::string&)> on_lost) {
  if (watcher_.joinable()) return;
  on_startup_failure_ = std::move(on_startup_failure);
  on_lost_ = std::move(on_lost);
  watcher_ = std::thread([this, policy] {
    while (!stopping_) {
      {
        std::lock_guard<std::mutex> l(mu_);
        for (Child& c : children_) {
          if (c.retired) continue;
          if (c.pending && !stopping_ && std::chrono::steady_clock::now() >= c.restart_at) {
            c.pending = false;
            auto pid = start(c.args, c.name, c.restarts_total + 1);
            if (!pid.ok()) {
              lose(c, c.name + " could not be restarted: " + pid.status().to_string());
              continue;
            }
            c.pid = *pid;
            c.reaped = false;
            c.started = std::chrono::steady_clock::now();
            c.restarts.push_back(c.started);
            ++c.restarts_total;
            spdlog::warn("restarted {} as process {}", c.name, c.pid);
          }
          if (c.reaped) continue;
          int st = 0;
          if (waitpid(c.pid, &st, WNOHANG) == c.pid) on_exit(c, st, policy);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

std::vector<ChildProcesses::ChildState> ChildProcesses::states() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<ChildState> out;
  for (const Child& c : children_)
    if (!c.retired) out.push_back({c.name, c.exits, c.restarts_total, !c.reaped, c.lost, c.lost_why});
  return out;
}

std::string ChildProcesses::lost() {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  for (const Child& c : children_)
    if (c.lost) out += (out.empty() ? "" : "; ") + c.lost_why;
  return out;
}

void ChildProcesses::stop_all() {
  stopping_ = true;
  // Children the watcher restarted get their PR_SET_PDEATHSIG (SIGTERM) as it ends here;
  // the rest get theirs below. Either way every child is stopped and reaped.
  if (watcher_.joinable()) watcher_.join();
  std::lock_guard<std::mutex> l(mu_);
  for (Child& c : children_)
    if (!c.reaped) kill(c.pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (Child& c : children_) {
    if (c.reaped) continue;
    int st = 0;
    while (waitpid(c.pid, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    c.reaped = true;
  }
}

Status ChildProcesses::stop(const std::string& name) {
  pid_t pid = -1;
  {
    std::lock_guard<std::mutex> l(mu_);
    Child* found = nullptr;
    for (Child& c : children_)
      if (c.name == name && !c.retired && !c.lost && (!c.reaped || c.pending)) found = &c;
    if (!found) return not_found("no running child process called '" + name + "'");
    found->retired = true;  // the watcher leaves it alone from now on
    found->pending = false;
    if (!found->reaped) pid = found->pid;
    found->reaped = true;
  }
  if (pid < 0) return Status();  // it had exited and waited for a restart
  kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  spdlog::info("stopped {} (process {})", name, pid);
  return Status();
}

ChildProcesses::~ChildProcesses() {
  stop_all();
  for (int fd : reserved_fds_) close(fd);
}

}  // namespace afd::cli
