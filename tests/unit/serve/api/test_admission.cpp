#include "serve/api/admission.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace afd::serve::test_admission {
namespace {

AdmissionOptions small_lane(int max_waiting) {
  AdmissionOptions o;
  o.inline_max_bytes = 100;
  o.threads = 1;
  o.max_waiting = max_waiting;
  return o;
}

TEST(AdmissionLane, SmallBodiesRunOnTheCallersThread) {
  AdmissionLane lane(small_lane(4));
  const auto caller = std::this_thread::get_id();
  auto r = lane.run(100, [&] { return std::this_thread::get_id(); });
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, caller);
}

TEST(AdmissionLane, LargeBodiesRunOnABackgroundPriorityThread) {
  AdmissionLane lane(small_lane(4));
  const auto caller = std::this_thread::get_id();
  auto r = lane.run(101, [&] { return std::make_pair(std::this_thread::get_id(), sched_getscheduler(0)); });
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->first, caller);
  if (lane.idle_priority()) {
    EXPECT_EQ(r->second, SCHED_IDLE);
  }
  // The caller's own priority is untouched.
  EXPECT_NE(sched_getscheduler(0), SCHED_IDLE);
}

TEST(AdmissionLane, RefusesLargeBodiesBeyondTheQueueBound) {
  AdmissionLane lane(small_lane(1));
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> running{false};
  auto first = std::async(std::launch::async, [&] {
    return lane.run(1000, [&] {
      running = true;
      gate.wait();
      return 1;
    });
  });
  while (!running) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto refused = lane.run(1000, [] { return 2; });
  EXPECT_FALSE(refused.has_value());
  EXPECT_EQ(lane.refused(), 1);
  // Small bodies are never refused.
  auto small = lane.run(10, [] { return 3; });
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(*small, 3);
  release.set_value();
  auto r = first.get();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, 1);
  // The slot is free again.
  auto again = lane.run(1000, [] { return 4; });
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, 4);
}

TEST(AdmissionLane, AnExceptionReachesTheCaller) {
  AdmissionLane lane(small_lane(2));
  EXPECT_THROW(lane.run(1000, []() -> int { throw std::runtime_error("boom"); }), std::runtime_error);
  auto r = lane.run(1000, [] { return 5; });
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, 5);
}

}  // namespace
}  // namespace afd::serve::test_admission
