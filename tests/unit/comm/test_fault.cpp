// Fault paths through FaultTransport: every fault ends in a clear Status within a
// deadline (no hang, no abort), and the link recovers afterwards.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "comm/fault_transport.h"
#include "comm/protocol.h"
#include "transport_pair.h"

namespace afd::comm {
namespace {

using testing::deadline_in_ms;

struct FaultPair {
  std::shared_ptr<InprocHub> hub = std::make_shared<InprocHub>();
  std::unique_ptr<Transport> a;
  std::unique_ptr<FaultTransport> b;  // the faulty sender
  PeerId a_sees_b = kNoPeer, b_sees_a = kNoPeer;
};

FaultPair make_fault_pair(const std::string& kind) {
  FaultPair p;
  p.a = testing::make_transport(kind, "server", p.hub);
  p.b = std::make_unique<FaultTransport>(testing::make_transport(kind, "client", p.hub), 7);
  std::string addr = testing::listen_any(kind, *p.a);
  EXPECT_TRUE(p.b->connect(addr).is_ok());
  p.b_sees_a = *wait_for_peer(*p.b, "server", deadline_in_ms(10000));
  p.a_sees_b = *wait_for_peer(*p.a, "client", deadline_in_ms(10000));
  return p;
}

class FaultTest : public ::testing::TestWithParam<std::string> {};

Status send_and_recv(FaultPair& p, uint64_t tag, uint64_t value, int64_t timeout_ms, uint64_t* got) {
  auto r = p.a->post_recv(p.a_sees_b, tag, got, 8);
  if (!r.ok()) return r.status();
  auto s = p.b->post_send(p.b_sees_a, tag, &value, 8);
  if (!s.ok()) return s.status();
  Completion c = p.a->wait(*r, deadline_in_ms(timeout_ms));
  if (c.status.code() == StatusCode::timeout) {
    p.a->cancel(*r);
    p.a->wait(*r, deadline_in_ms(5000));
  }
  p.b->wait(*s, deadline_in_ms(5000));
  return c.status;
}

TEST_P(FaultTest, CapsReportFaultInjection) {
  auto p = make_fault_pair(GetParam());
  EXPECT_TRUE(p.b->caps().fault_injection);
  EXPECT_NE(std::string(p.b->kind()).find("fault("), std::string::npos);
}

TEST_P(FaultTest, DroppedMessageTimesOutThenLinkWorks) {
  auto p = make_fault_pair(GetParam());
  p.b->drop_next_sends(1);
  uint64_t got = 0;
  int64_t t0 = now_ns();
  EXPECT_EQ(send_and_recv(p, 1, 11, 100, &got).code(), StatusCode::timeout);
  EXPECT_LT(now_ns() - t0, 3000000000);
  EXPECT_TRUE(send_and_recv(p, 1, 12, 5000, &got).is_ok());
  EXPECT_EQ(got, 12u);
}

TEST_P(FaultTest, DelayIsAppliedAndOrderKept) {
  auto p = make_fault_pair(GetParam());
  constexpr int64_t kDelay = 5000000;  // 5 ms
  p.b->set_delay_ns(kDelay);
  std::vector<uint64_t> vals(10), got(10);
  std::vector<RequestId> rs, ss;
  for (int i = 0; i < 10; ++i) rs.push_back(*p.a->post_recv(p.a_sees_b, 2, &got[i], 8));
  int64_t t0 = now_ns();
  for (int i = 0; i < 10; ++i) {
    vals[i] = 100 + i;
    ss.push_back(*p.b->post_send(p.b_sees_a, 2, &vals[i], 8));
  }
  ASSERT_TRUE(p.a->wait(rs[0], deadline_in_ms(5000)).status.is_ok());
  EXPECT_GE(now_ns() - t0, kDelay);
  for (int i = 1; i < 10; ++i) ASSERT_TRUE(p.a->wait(rs[i], deadline_in_ms(5000)).status.is_ok());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i], vals[i]);
  for (auto s : ss) EXPECT_TRUE(p.b->wait(s, deadline_in_ms(5000)).status.is_ok());
}

TEST_P(FaultTest, StallTimesOutAndResumes) {
  auto p = make_fault_pair(GetParam());
  p.b->set_stall(true);
  uint64_t got = 0, v = 77;
  auto r = p.a->post_recv(p.a_sees_b, 3, &got, 8);
  auto s = p.b->post_send(p.b_sees_a, 3, &v, 8);
  EXPECT_EQ(p.a->wait(*r, deadline_in_ms(100)).status.code(), StatusCode::timeout);
  p.b->set_stall(false);
  EXPECT_TRUE(p.a->wait(*r, deadline_in_ms(5000)).status.is_ok());
  EXPECT_EQ(got, 77u);
  EXPECT_TRUE(p.b->wait(*s, deadline_in_ms(5000)).status.is_ok());
}

TEST_P(FaultTest, CorruptedFrameIsACorruptDataError) {
  auto p = make_fault_pair(GetParam());
  alignas(8) uint8_t frame[kFrameHeaderBytes + kHandshakeBytes];
  Handshake h;
  h.n_attention = 1;
  h.n_ffn = 1;
  h.n_microbatches = 1;
  size_t len = encode_handshake(FrameKind::hello, h, frame);
  std::vector<uint8_t> original(frame, frame + len);
  for (int round = 0; round < 20; ++round) {
    p.b->corrupt_next_sends(1, 1 + round % 4);
    alignas(8) uint8_t got[256];
    auto r = p.a->post_recv(p.a_sees_b, 4, got, sizeof got);
    auto s = p.b->post_send(p.b_sees_a, 4, frame, len);
    Completion c = p.a->wait(*r, deadline_in_ms(5000));
    ASSERT_TRUE(c.status.is_ok());
    auto d = decode_handshake(got, c.bytes, FrameKind::hello);
    EXPECT_EQ(d.status().code(), StatusCode::corrupt_data) << "round " << round;
    p.b->wait(*s, deadline_in_ms(5000));
    // The sender's buffer is never modified.
    EXPECT_EQ(0, std::memcmp(frame, original.data(), len));
  }
}

TEST_P(FaultTest, DisconnectOnCommandAndReconnect) {
  auto p = make_fault_pair(GetParam());
  uint64_t got = 0;
  auto r = p.a->post_recv(p.a_sees_b, 5, &got, 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(p.b->disconnect(p.b_sees_a).is_ok());
  Completion c = p.a->wait(*r, deadline_in_ms(5000));
  EXPECT_EQ(c.status.code(), StatusCode::unavailable) << c.status.to_string();
  ASSERT_TRUE(wait_for_peer(*p.b, "server", deadline_in_ms(10000)).ok());
  ASSERT_TRUE(wait_for_peer(*p.a, "client", deadline_in_ms(10000)).ok());
  EXPECT_TRUE(send_and_recv(p, 6, 99, 5000, &got).is_ok());
  EXPECT_EQ(got, 99u);
}

// A send held by a stall belongs to the connection it was posted on: when that connection
// is dropped, the send fails, and lifting the stall later does not deliver it through the
// next connection (where an FFN worker's stale reply would reach the attention side's next
// pass from a buffer the worker had reused — "bad magic").
TEST_P(FaultTest, HeldSendFailsWithItsConnection) {
  auto p = make_fault_pair(GetParam());
  p.b->set_stall(true);
  uint64_t stale = 111, sentinel = 0;
  auto s = p.b->post_send(p.b_sees_a, 7, &stale, 8);
  ASSERT_TRUE(s.ok());
  auto lost = p.a->post_recv(p.a_sees_b, 9, &sentinel, 8);  // fails once a has seen the loss
  ASSERT_TRUE(p.b->disconnect(p.b_sees_a).is_ok());
  Completion cs = p.b->wait(*s, deadline_in_ms(5000));
  EXPECT_EQ(cs.status.code(), StatusCode::unavailable) << cs.status.to_string();
  EXPECT_NE(cs.status.message().find("disconnected while the send was held"), std::string::npos)
      << cs.status.to_string();
  EXPECT_EQ(p.a->wait(*lost, deadline_in_ms(5000)).status.code(), StatusCode::unavailable);
  ASSERT_TRUE(wait_for_peer(*p.b, "server", deadline_in_ms(10000)).ok());
  ASSERT_TRUE(wait_for_peer(*p.a, "client", deadline_in_ms(10000)).ok());
  uint64_t got = 0;
  auto r = p.a->post_recv(p.a_sees_b, 7, &got, 8);
  p.b->set_stall(false);
  EXPECT_EQ(p.a->wait(*r, deadline_in_ms(200)).status.code(), StatusCode::timeout) << "got " << got;
  p.a->cancel(*r);
  p.a->wait(*r, deadline_in_ms(5000));
  EXPECT_TRUE(send_and_recv(p, 8, 222, 5000, &got).is_ok());  // the new connection works
  EXPECT_EQ(got, 222u);
}

// Random drops and corruptions on a stream of frames: every receive ends (ok, timeout or
// a decode error) within its deadline; nothing hangs or crashes.
TEST_P(FaultTest, FaultStormNeverHangs) {
  auto p = make_fault_pair(GetParam());
  p.b->set_drop_probability(0.2);
  std::mt19937 rng(3);
  int ok = 0, lost = 0, corrupt = 0;
  for (int i = 0; i < 60; ++i) {
    if (rng() % 4 == 0) p.b->corrupt_next_sends(1, 2);
    alignas(8) uint8_t frame[256], got[256];
    FrameHeader h;
    h.kind = FrameKind::f2a;
    h.n_tokens = 1;
    h.hidden = 64;
    h.step = static_cast<uint64_t>(i);
    h.payload_bytes = f2a_payload_bytes(1, 64);
    h.flags = kFlagPayloadChecksum;
    std::memset(frame + kFrameHeaderBytes, i, h.payload_bytes);
    encode_header(h, frame + kFrameHeaderBytes, frame);
    size_t len = kFrameHeaderBytes + h.payload_bytes;
    uint64_t tag = 1000 + static_cast<uint64_t>(i);  // fresh tag: a dropped frame never matches later
    auto r = p.a->post_recv(p.a_sees_b, tag, got, sizeof got);
    auto s = p.b->post_send(p.b_sees_a, tag, frame, len);
    Completion c = p.a->wait(*r, deadline_in_ms(30));
    if (c.status.code() == StatusCode::timeout) {
      ++lost;
      p.a->cancel(*r);
      EXPECT_NE(p.a->wait(*r, deadline_in_ms(5000)).status.code(), StatusCode::timeout);
    } else if (decode_f2a(got, c.bytes, 64, 1).ok()) {
      ++ok;
    } else {
      ++corrupt;
    }
    EXPECT_NE(p.b->wait(*s, deadline_in_ms(5000)).status.code(), StatusCode::timeout);
  }
  EXPECT_EQ(ok + lost + corrupt, 60);
  EXPECT_GT(ok, 0);
  EXPECT_GT(lost, 0);
  EXPECT_GT(corrupt, 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, FaultTest, ::testing::Values("inproc", "ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace afd::comm
