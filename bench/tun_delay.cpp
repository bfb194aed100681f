// tun_delay: a user-space delay line between two network namespaces, for kernels built
// without sch_netem (bench/netns_ucx.sh uses it when `tc qdisc add ... netem` fails).
//
//   tun_delay NS_A DEV_A NS_B DEV_B DELAY_US
//
// Creates TUN device DEV_A inside network namespace NS_A and DEV_B inside NS_B (the names
// `ip netns` uses, under /run/netns), prints "ready" once both exist, then copies every IP
// packet read from one device to the other DELAY_US microseconds later, in order: a
// constant one-way delay on every packet, as `netem delay` gives. The caller assigns the
// addresses (`ip -n NS_A addr add A peer B dev DEV_A`, link up); the devices vanish when
// this process exits (SIGINT / SIGTERM).
//
// Each direction has its own thread, which sleeps until the next packet is due or a new one
// arrives (timer slack 1 ns). It adds its own forwarding cost (a read and a write per
// packet), so a run through it at DELAY_US 0 is the baseline to compare against, not a run
// over veth.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "core/timer.h"

namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) { g_stop.store(true); }

// Opens a TUN device named `dev` inside network namespace `ns`; -1 (message printed) on error.
int open_tun_in(const std::string& ns, const std::string& dev) {
  int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  int target = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (self < 0 || target < 0) {
    std::fprintf(stderr, "tun_delay: cannot open network namespace '%s': %s\n", ns.c_str(), std::strerror(errno));
    return -1;
  }
  int fd = -1;
  if (setns(target, CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "tun_delay: setns(%s): %s\n", ns.c_str(), std::strerror(errno));
  } else {
    fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    ifreq ifr{};
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", dev.c_str());
    if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) {
      std::fprintf(stderr, "tun_delay: cannot create TUN device '%s' in '%s': %s\n", dev.c_str(), ns.c_str(),
                   std::strerror(errno));
      if (fd >= 0) close(fd);
      fd = -1;
    }
    if (setns(self, CLONE_NEWNET) != 0) std::fprintf(stderr, "tun_delay: cannot return to own namespace\n");
  }
  close(self);
  close(target);
  if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

struct Packet {
  int64_t due_ns;
  std::vector<uint8_t> bytes;
};

// Forwards packets from `src` to `dst`, each `delay_ns` after it was read.
void forward(int src, int dst, int64_t delay_ns) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  std::deque<Packet> line;
  std::vector<uint8_t> buf(65536);
  while (!g_stop.load(std::memory_order_relaxed)) {
    int64_t now = afd::now_ns();
    while (!line.empty() && line.front().due_ns <= now) {
      // A full TUN queue on the far side drops the packet, as a full link would.
      ssize_t w = write(dst, line.front().bytes.data(), line.front().bytes.size());
      (void)w;
      line.pop_front();
    }
    int64_t wait_ns = line.empty() ? 100000000 : line.front().due_ns - now;
    timespec ts{static_cast<time_t>(wait_ns / 1000000000), static_cast<long>(wait_ns % 1000000000)};
    pollfd p{src, POLLIN, 0};
    if (ppoll(&p, 1, &ts, nullptr) <= 0) continue;
    for (;;) {
      ssize_t n = read(src, buf.data(), buf.size());
      if (n <= 0) break;
      line.push_back(Packet{afd::now_ns() + delay_ns, std::vector<uint8_t>(buf.begin(), buf.begin() + n)});
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: tun_delay NS_A DEV_A NS_B DEV_B DELAY_US\n");
    return 2;
  }
  char* end = nullptr;
  long long delay_us = std::strtoll(argv[5], &end, 10);
  if (end == argv[5] || *end != 0 || delay_us < 0 || delay_us > 10000000) {
    std::fprintf(stderr, "tun_delay: DELAY_US must be an integer in [0, 10000000], got '%s'\n", argv[5]);
    return 2;
  }
  int a = open_tun_in(argv[1], argv[2]);
  int b = a < 0 ? -1 : open_tun_in(argv[3], argv[4]);
  if (a < 0 || b < 0) return 1;
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::printf("ready\n");
  std::fflush(stdout);
  int64_t delay_ns = delay_us * 1000;
  std::thread ab([&] { forward(a, b, delay_ns); });
  std::thread ba([&] { forward(b, a, delay_ns); });
  ab.join();
  ba.join();
  close(a);
  close(b);
  return 0;
}
