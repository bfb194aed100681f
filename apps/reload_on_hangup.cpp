#include "reload_on_hangup.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

namespace afd::cli {

namespace {

int g_pipe[2] = {-1, -1};

extern "C" void on_hangup(int) {
  const unsigned char b = 1;
  ssize_t r = write(g_pipe[1], &b, 1);
  (void)r;
}

}  // namespace

Result<std::unique_ptr<ReloadOnHangup>> ReloadOnHangup::start(std::function<void()> action) {
  if (g_pipe[0] < 0 && pipe2(g_pipe, O_CLOEXEC) != 0) return io_error("pipe() failed for the SIGHUP handler");
  std::unique_ptr<ReloadOnHangup> r(new ReloadOnHangup());
  // A 1 byte per SIGHUP; the destructor's 0 byte ends the thread.
  r->thread_ = std::thread([action = std::move(action)] {
    unsigned char b = 0;
    while (read(g_pipe[0], &b, 1) == 1 && b != 0) action();
  });
  struct sigaction sa {};
  sa.sa_handler = on_hangup;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGHUP, &sa, nullptr);
  return r;
}

ReloadOnHangup::~ReloadOnHangup() {
  signal(SIGHUP, SIG_DFL);
  const unsigned char end = 0;
  ssize_t r = write(g_pipe[1], &end, 1);
  (void)r;
  if (thread_.joinable()) thread_.join();
}

}  // namespace afd::cli
