// runtime/afd/liveness.h: a ping written by one side is read by the other and answered
// with the matching pong; what the attention side makes of pong receives; when a ping is
// overdue.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "../../comm/transport_pair.h"
#include "comm/protocol.h"
#include "core/timer.h"
#include "runtime/afd/liveness.h"

namespace afd::test_liveness {
namespace {

TEST(AfdLiveness, PingPongRoundTripAndVerdicts) {
  auto hub = std::make_shared<comm::InprocHub>();
  auto t = comm::InprocTransport::create(hub, "probe-test");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ProbeBuffers attn, ffn;
  EXPECT_FALSE(attn.ready());
  ASSERT_TRUE(attn.ensure(t->get()).is_ok());
  ASSERT_TRUE(ffn.ensure(t->get()).is_ok());
  const uint8_t* kept = attn.ping.data();
  ASSERT_TRUE(attn.ensure(t->get()).is_ok());  // already there: kept
  EXPECT_EQ(attn.ping.data(), kept);

  // Attention side pings (seq 7); the FFN side reads it and writes the pong.
  const size_t n = write_ping(attn, 7);
  EXPECT_EQ(n, comm::kFrameHeaderBytes);
  std::memcpy(ffn.ping.data(), attn.ping.data(), n);
  auto seq = read_ping(ffn, n);
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  EXPECT_EQ(*seq, 7u);
  const size_t m = write_pong(ffn, *seq);
  std::memcpy(attn.pong.data(), ffn.pong.data(), m);

  std::string why;
  comm::Completion ok{Status(), m};
  EXPECT_EQ(judge_pong(ok, attn, 7, &why), PongVerdict::answered);
  EXPECT_EQ(judge_pong(ok, attn, 8, &why), PongVerdict::owed);  // the pong of an older ping
  EXPECT_TRUE(why.empty());
  comm::Completion lost{unavailable("peer gone"), 0};
  EXPECT_EQ(judge_pong(lost, attn, 7, &why), PongVerdict::lost);
  attn.pong.data()[3] ^= 0xff;  // broken magic
  EXPECT_EQ(judge_pong(ok, attn, 7, &why), PongVerdict::owed);
  EXPECT_FALSE(why.empty());

  // A pong is not a ping: the FFN side refuses it.
  std::memcpy(ffn.ping.data(), ffn.pong.data(), m);
  EXPECT_FALSE(read_ping(ffn, m).ok());
  EXPECT_FALSE(read_ping(ffn, 10).ok());  // truncated
}

TEST(AfdLiveness, Overdue) {
  constexpr int64_t kMs = 1000000;
  EXPECT_FALSE(probe_overdue(0, 1000 * kMs, 10));        // none in flight
  EXPECT_FALSE(probe_overdue(100 * kMs, 110 * kMs, 10));  // exactly the timeout: not yet
  EXPECT_TRUE(probe_overdue(100 * kMs, 110 * kMs + 1, 10));
}

// The FFN side of a probe, by hand: receives one ping and (if `answer`) sends its pong.
struct FfnEnd {
  comm::Transport* t;
  comm::PeerId peer;
  ProbeBuffers buf;
  comm::RequestId recv = 0;
  void expect_ping() {
    ASSERT_TRUE(buf.ensure(t).is_ok());
    auto r = t->post_recv(peer, probe_tag(), buf.ping.data(), buf.ping.capacity());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    recv = *r;
  }
  void answer() {
    comm::Completion c = t->wait(recv, now_ns() + int64_t{10000} * 1000000);
    ASSERT_TRUE(c.status.is_ok()) << c.status.to_string();
    auto seq = read_ping(buf, c.bytes);
    ASSERT_TRUE(seq.ok()) << seq.status().to_string();
    const size_t n = write_pong(buf, *seq);
    auto sd = t->post_send(peer, probe_tag(), buf.pong.data(), n);
    ASSERT_TRUE(sd.ok());
    t->wait(*sd, now_ns() + int64_t{10000} * 1000000);
  }
};

// Reaps until the pong is taken (the transport delivers it on its own thread); `now` is the
// probe's clock, given.
PeerProbe::Reaped reap_until_taken(PeerProbe& p, comm::Transport* t, int64_t now, int64_t interval, int64_t timeout_ms) {
  const int64_t give_up = now_ns() + int64_t{10000} * 1000000;
  PeerProbe::Reaped r;
  do {
    r = p.reap(t, now, interval, timeout_ms);
    if (!p.awaiting()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (now_ns() < give_up);
  return r;
}

TEST(AfdLiveness, PeerProbeAnsweredSilentAndBack) {
  constexpr int64_t kMs = 1000000, kInterval = 100 * kMs, kTimeout = 50;
  comm::testing::Pair pr = comm::testing::make_pair("inproc");
  ASSERT_NE(pr.b_sees_a, comm::kNoPeer);
  FfnEnd ffn{pr.a.get(), pr.a_sees_b, {}, 0};
  PeerProbe p;
  ASSERT_TRUE(p.buf.ensure(pr.b.get()).is_ok());
  EXPECT_FALSE(p.ping(pr.b.get(), comm::kNoPeer, 0, kInterval));  // nobody to ping: the next try later
  EXPECT_EQ(p.next_ns, kInterval);
  EXPECT_FALSE(p.due(kInterval - 1));
  EXPECT_TRUE(p.due(kInterval));

  // Answered.
  ffn.expect_ping();
  int64_t t0 = 1000 * kMs;
  ASSERT_TRUE(p.ping(pr.b.get(), pr.b_sees_a, t0, kInterval));
  EXPECT_EQ(p.sent_ns.load(), t0);
  EXPECT_FALSE(p.due(t0 + 10 * kInterval));  // one ping in flight at most
  ffn.answer();
  PeerProbe::Reaped r = reap_until_taken(p, pr.b.get(), t0 + kMs, kInterval, kTimeout);
  EXPECT_TRUE(r.answered);
  EXPECT_FALSE(r.back);
  EXPECT_EQ(p.answered.load(), 1);
  EXPECT_EQ(p.sent_ns.load(), 0);
  EXPECT_EQ(p.next_ns, t0 + kMs + kInterval);

  // Silent past the timeout: overdue, reported once; then answered: back.
  ffn.expect_ping();
  t0 = 2000 * kMs;
  ASSERT_TRUE(p.ping(pr.b.get(), pr.b_sees_a, t0, kInterval));
  r = p.reap(pr.b.get(), t0 + kTimeout * kMs, kInterval, kTimeout);
  EXPECT_FALSE(r.became_overdue);  // exactly the timeout: not yet
  r = p.reap(pr.b.get(), t0 + kTimeout * kMs + 1, kInterval, kTimeout);
  EXPECT_TRUE(r.became_overdue);
  EXPECT_TRUE(p.overdue);
  r = p.reap(pr.b.get(), t0 + 2 * kTimeout * kMs, kInterval, kTimeout);
  EXPECT_FALSE(r.became_overdue);
  ffn.answer();
  r = reap_until_taken(p, pr.b.get(), t0 + 300 * kMs, kInterval, kTimeout);
  EXPECT_TRUE(r.answered);
  EXPECT_TRUE(r.back);
  EXPECT_EQ(r.back_after_ms, 300);
  EXPECT_FALSE(p.overdue);
  EXPECT_EQ(p.answered.load(), 2);
  p.stop(pr.b.get());
}

}  // namespace
}  // namespace afd::test_liveness
