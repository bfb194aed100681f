#include "local_ffn.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "core/log.h"
#include "runtime/topology.h"

namespace afd::cli {

namespace {
// A currently free TCP port on 127.0.0.1 (the OS picks; another process could take it
// before the worker binds — the worker then fails with a clear error).
Result<int> free_port() {
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
}  // namespace

Status LocalFfnProcesses::start(const EngineFlags& flags, EngineOptions* o) {
  if (!flags.spawn_ffn) return Status::ok();
  if (!o->ffn_addresses.empty()) return invalid_argument("--spawn-ffn and --ffn exclude each other");
  AFD_ASSIGN_OR_RETURN(Topology t, parse_topology(o->topology));
  if (t.wiring != Wiring::afd) return invalid_argument("--spawn-ffn needs an xAyF topology, got '" + o->topology + "'");
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return io_error("cannot find this executable (/proc/self/exe)");
  exe[n] = '\0';
  for (int j = 0; j < t.n_ffn; ++j) {
    AFD_ASSIGN_OR_RETURN(int port, free_port());
    const std::string addr = "127.0.0.1:" + std::to_string(port);
    std::vector<std::string> args = {exe,
                                     "worker",
                                     "--role",
                                     "ffn",
                                     "--model",
                                     o->model_dir,
                                     "--listen",
                                     addr,
                                     "--shard",
                                     std::to_string(j) + "/" + std::to_string(t.n_ffn),
                                     "--attention",
                                     std::to_string(t.n_attention),
                                     "--precision",
                                     flags.precision};
    if (flags.threads > 0) {
      args.push_back("--threads");
      args.push_back(std::to_string(flags.threads));
    }
    const pid_t pid = fork();
    if (pid < 0) return io_error("fork() failed starting FFN worker " + std::to_string(j));
    if (pid == 0) {
      sigset_t none;  // the mask survives exec: give the worker default signal handling
      sigemptyset(&none);
      pthread_sigmask(SIG_SETMASK, &none, nullptr);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(exe, argv.data());
      _exit(127);
    }
    children_.push_back(pid);
    o->ffn_addresses.push_back(addr);
    spdlog::info("started FFN worker {}/{} as process {} on {}", j, t.n_ffn, pid, addr);
  }
  o->attention_index = 0;
  o->local_attention = t.n_attention;
  return Status::ok();
}

LocalFfnProcesses::~LocalFfnProcesses() {
  for (pid_t p : children_) kill(p, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (pid_t p : children_) {
    int st = 0;
    while (waitpid(p, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(p, SIGKILL);
        waitpid(p, &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace afd::cli
