// UCX across processes: a child process (this binary re-executed with --echo-server)
// echoes frames; the parent sees it die (SIGKILL) as a clear error within a deadline,
// and takes it back when a new child starts on the same address.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "comm/ucx_transport.h"
#include "core/timer.h"

namespace afd::comm {
namespace {

int64_t deadline_in_ms(int64_t ms) { return now_ns() + ms * 1000000; }

// Child: listen on argv address, echo tag 1 -> tag 2 forever.
int run_echo_server(const std::string& address) {
  UcxOptions o;
  o.name = "echo";
  auto t = UcxTransport::create(o);
  if (!t.ok()) return 2;
  if (!(*t)->listen(address).is_ok()) return 3;
  auto peer = wait_for_peer(**t, "parent", deadline_in_ms(20000));
  if (!peer.ok()) return 4;
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    auto r = (*t)->post_recv(*peer, 1, buf.data(), buf.size());
    if (!r.ok()) return 5;
    Completion c = (*t)->wait(*r, deadline_in_ms(60000));
    if (!c.status.is_ok()) return 0;
    auto s = (*t)->post_send(*peer, 2, buf.data(), c.bytes);
    if (!s.ok() || !(*t)->wait(*s, deadline_in_ms(10000)).status.is_ok()) return 0;
  }
}

pid_t spawn_echo(const std::string& address) {
  pid_t pid = fork();
  if (pid == 0) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) _exit(10);
    self[n] = 0;
    execl(self, self, "--echo-server", address.c_str(), static_cast<char*>(nullptr));
    _exit(11);
  }
  return pid;
}

Status echo_once(Transport& t, PeerId peer, size_t n, uint8_t fill, int64_t timeout_ms) {
  std::vector<uint8_t> out(n, fill), in(n + 64);
  AFD_ASSIGN_OR_RETURN(RequestId r, t.post_recv(peer, 2, in.data(), in.size()));
  AFD_ASSIGN_OR_RETURN(RequestId s, t.post_send(peer, 1, out.data(), out.size()));
  Completion c = t.wait(r, deadline_in_ms(timeout_ms));
  if (c.status.code() == StatusCode::timeout) {
    t.cancel(r);
    t.wait(r, deadline_in_ms(5000));
  }
  Completion cs = t.wait(s, deadline_in_ms(timeout_ms));
  if (!cs.status.is_ok() && cs.status.code() == StatusCode::timeout) {
    t.cancel(s);
  }
  AFD_RETURN_IF_ERROR(c.status);
  if (c.bytes != n || std::memcmp(in.data(), out.data(), n) != 0) return internal_error("echo mismatch");
  return Status();
}

TEST(UcxProcess, PeerDeathIsAnErrorAndRestartIsTakenBack) {
  UcxOptions o;
  o.name = "parent";
  o.connect_retry_ms = 50;
  auto t = UcxTransport::create(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // A free port: bind :0 on a probe transport, then release it.
  uint16_t port;
  {
    auto probe = UcxTransport::create(UcxOptions{"probe"});
    ASSERT_TRUE(probe.ok());
    ASSERT_TRUE((*probe)->listen("127.0.0.1:0").is_ok());
    port = (*probe)->listen_port();
  }
  std::string addr = "127.0.0.1:" + std::to_string(port);
  // Dial first: the child starts later (any start order works).
  ASSERT_TRUE((*t)->connect(addr).is_ok());
  pid_t child = spawn_echo(addr);
  ASSERT_GT(child, 0);
  auto peer = wait_for_peer(**t, "echo", deadline_in_ms(20000));
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  for (size_t n : {size_t{64}, size_t{8192}, size_t{300000}}) {
    Status s = echo_once(**t, *peer, n, static_cast<uint8_t>(n), 5000);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  // Kill the child while a receive is pending: the receive fails, no hang.
  std::vector<uint8_t> in(64);
  auto r = (*t)->post_recv(*peer, 2, in.data(), in.size());
  ASSERT_TRUE(r.ok());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  int64_t t0 = now_ns();
  Completion c = (*t)->wait(*r, deadline_in_ms(10000));
  EXPECT_EQ(c.status.code(), StatusCode::unavailable) << c.status.to_string();
  EXPECT_LT(now_ns() - t0, 5000000000);
  EXPECT_FALSE((*t)->is_connected(*peer));
  // A new child on the same address is taken back under the same PeerId.
  child = spawn_echo(addr);
  auto again = wait_for_peer(**t, "echo", deadline_in_ms(20000));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, *peer);
  Status s = echo_once(**t, *peer, 4096, 9, 5000);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

}  // namespace
}  // namespace afd::comm

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--echo-server") return afd::comm::run_echo_server(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
