// runtime/afd/transport_ops.h over an in-process pair: ending operations that will not be
// needed, and waiting with a cancel at the deadline.
#include <gtest/gtest.h>

#include <array>

#include "../../comm/transport_pair.h"
#include "runtime/afd/transport_ops.h"

namespace afd::test_transport_ops {
namespace {

TEST(AfdTransportOps, EndAndWaitOrCancel) {
  comm::testing::Pair p = comm::testing::make_pair("inproc");
  ASSERT_NE(p.b_sees_a, comm::kNoPeer);
  std::array<uint8_t, 64> buf{};

  // A receive nobody sends to: end_op cancels it and it ends; the flag drops.
  auto r = p.b->post_recv(p.b_sees_a, 77, buf.data(), buf.size());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  bool live = true;
  EXPECT_TRUE(end_op(p.b.get(), *r, &live));
  EXPECT_FALSE(live);
  EXPECT_TRUE(end_op(p.b.get(), *r, &live));  // not live: nothing to do

  // wait_or_cancel: a receive that does not complete in time reports the timeout and is
  // cancelled; one that does reports its completion.
  r = p.b->post_recv(p.b_sees_a, 78, buf.data(), buf.size());
  ASSERT_TRUE(r.ok());
  comm::Completion c = wait_or_cancel(p.b.get(), *r, 20);
  EXPECT_EQ(c.status.code(), StatusCode::timeout);

  r = p.b->post_recv(p.b_sees_a, 79, buf.data(), buf.size());
  ASSERT_TRUE(r.ok());
  std::array<uint8_t, 8> msg{1, 2, 3, 4, 5, 6, 7, 8};
  auto s = p.a->post_send(p.a_sees_b, 79, msg.data(), msg.size());
  ASSERT_TRUE(s.ok());
  c = wait_or_cancel(p.b.get(), *r, 10000);
  EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(c.bytes, msg.size());
  EXPECT_EQ(buf[7], 8);
  p.a->wait(*s, deadline_in_ms(10000));
}

}  // namespace
}  // namespace afd::test_transport_ops
