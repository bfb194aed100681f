// runtime/afd/liveness.h: a ping written by one side is read by the other and answered
// with the matching pong; what the attention side makes of pong receives; when a ping is
// overdue.
#include <gtest/gtest.h>

#include <cstring>

#include "../../comm/transport_pair.h"
#include "comm/protocol.h"
#include "runtime/afd/liveness.h"

namespace afd {
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
  comm::Completion ok{Status::ok(), m};
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

}  // namespace
}  // namespace afd
