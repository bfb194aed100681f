#include "child_processes.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "core/log.h"

namespace afd::cli {

Result<int> free_local_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return io_error("socket() failed");
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
  const int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

Result<pid_t> ChildProcesses::spawn_self(const std::vector<std::string>& args, const std::string& name) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return io_error("cannot find this executable (/proc/self/exe)");
  exe[n] = '\0';
  std::vector<std::string> argv_s = {exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return io_error("fork() failed starting " + name);
  if (pid == 0) {
    sigset_t none;  // the mask survives exec: give the worker default signal handling
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent died before prctl
    execv(exe, argv.data());
    _exit(127);
  }
  std::lock_guard<std::mutex> l(mu_);
  children_.push_back({pid, name, false});
  return pid;
}

void ChildProcesses::watch() {
  if (watcher_.joinable()) return;
  watcher_ = std::thread([this] {
    while (!stopping_) {
      {
        std::lock_guard<std::mutex> l(mu_);
        for (Child& c : children_) {
          if (c.reaped) continue;
          int st = 0;
          if (waitpid(c.pid, &st, WNOHANG) == c.pid) {
            c.reaped = true;
            if (!stopping_)
              spdlog::error("{} (process {}) exited ({} {})", c.name, c.pid, WIFSIGNALED(st) ? "signal" : "status",
                            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
}

void ChildProcesses::stop_all() {
  stopping_ = true;
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

ChildProcesses::~ChildProcesses() { stop_all(); }

}  // namespace afd::cli
