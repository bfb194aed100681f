// The restart policy of worker processes (plan_restart, a pure function) and ChildProcesses
// restarting, then losing, a child that keeps exiting. The children are this test binary
// run with a filter that matches no test: it starts and exits 0 at once.
#include "child_processes.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

namespace afd::cli {
namespace {

constexpr const char* kSleeperFilter = "ChildProcessesHelper.SleepsWhenAsked:NoSuchTest.SleeperMarker";

RestartPolicy policy(int per_minute = 5) {
  RestartPolicy p;
  p.max_per_minute = per_minute;
  p.backoff_ms = 500;
  p.max_backoff_ms = 10000;
  p.half_life_ms = 10000;
  return p;
}

TEST(PlanRestart, FirstExitWaitsTheInitialBackoff) {
  const RestartDecision d = plan_restart(policy(), 0, 0, 0);
  EXPECT_TRUE(d.restart);
  EXPECT_EQ(d.delay_ms, 500);
}

TEST(PlanRestart, OffOrExhaustedMeansNoRestart) {
  EXPECT_FALSE(plan_restart(policy(0), 0, 0, 0).restart);
  EXPECT_FALSE(plan_restart(policy(5), 500, 100000, 5).restart);  // 5 restarts in the last minute, 5 allowed
  EXPECT_FALSE(plan_restart(policy(1), 0, 100000, 1).restart);
  EXPECT_TRUE(plan_restart(policy(5), 500, 100, 4).restart);
}

// Dying at start-up, again and again: the delay doubles up to the cap.
TEST(PlanRestart, CrashLoopDoublesUpToTheCap) {
  int delay = 0;
  std::vector<int> seen;
  for (int i = 0; i < 7; ++i) {
    const RestartDecision d = plan_restart(policy(1000), delay, 0, 0);
    ASSERT_TRUE(d.restart);
    delay = d.delay_ms;
    seen.push_back(delay);
  }
  EXPECT_EQ(seen, (std::vector<int>{500, 1000, 2000, 4000, 8000, 10000, 10000}));
}

// The case: a worker crashing 30 s after each start. Uptime of three half-lives
// earns the delay back down each time, so it stays at the initial one instead of growing.
TEST(PlanRestart, CrashesThirtySecondsApartKeepTheInitialDelay) {
  int delay = 0;
  for (int i = 0; i < 10; ++i) {
    const RestartDecision d = plan_restart(policy(), delay, 30000, 1);
    ASSERT_TRUE(d.restart);
    delay = d.delay_ms;
    EXPECT_EQ(delay, 500) << "exit " << i;
  }
}

// Halves per half-life of uptime, after the doubling for this exit.
TEST(PlanRestart, DelayDecaysWithUptime) {
  EXPECT_EQ(plan_restart(policy(), 4000, 10000, 0).delay_ms, 4000);  // one half-life: kept
  EXPECT_EQ(plan_restart(policy(), 4000, 20000, 0).delay_ms, 2000);
  EXPECT_EQ(plan_restart(policy(), 4000, 5000, 0).delay_ms, 5657);   // 8000 / sqrt(2)
  EXPECT_EQ(plan_restart(policy(), 8000, 3600000, 0).delay_ms, 500);  // long stable: the floor
}

// No cliff: the delay is continuous in the uptime (the old rule reset it only past 60 s).
TEST(PlanRestart, NoCliffAtAnyUptime) {
  for (int64_t t = 0; t < 120000; t += 1000) {
    const int a = plan_restart(policy(), 8000, t, 0).delay_ms;
    const int b = plan_restart(policy(), 8000, t + 10, 0).delay_ms;
    EXPECT_LE(std::abs(a - b), 10) << "uptime " << t << " ms";
    EXPECT_GE(a, b) << "longer uptime never waits longer (" << t << " ms)";
  }
}

TEST(PlanRestart, ZeroHalfLifeAlwaysWaitsTheInitialBackoff) {
  RestartPolicy p = policy();
  p.half_life_ms = 0;
  EXPECT_EQ(plan_restart(p, 8000, 0, 0).delay_ms, 500);
}

// A child that exits on its own is restarted max_per_minute times, then lost: once, with a
// reason naming it and the exhaustion, in lost(), states() and the on_lost hook.
TEST(ChildProcesses, RestartsThenLosesAChildThatKeepsExiting) {
  ChildProcesses children;
  auto pid = children.spawn_self({"--gtest_filter=NoSuchTest.Exists"}, "test worker 0");
  ASSERT_TRUE(pid.ok()) << pid.status().to_string();
  std::mutex mu;
  std::vector<std::string> lost_calls;
  RestartPolicy p;
  p.max_per_minute = 2;
  p.backoff_ms = 20;
  p.max_backoff_ms = 40;
  children.watch(p, {}, [&](const std::string& why) {
    std::lock_guard<std::mutex> l(mu);
    lost_calls.push_back(why);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (children.lost().empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string lost = children.lost();
  ASSERT_FALSE(lost.empty());
  EXPECT_NE(lost.find("test worker 0"), std::string::npos) << lost;
  EXPECT_NE(lost.find("restarts exhausted"), std::string::npos) << lost;
  EXPECT_NE(lost.find("exited (status 0)"), std::string::npos) << lost;
  // Nothing more happens to a lost child.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto st = children.states();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].exits, 3);
  EXPECT_EQ(st[0].restarts, 2);
  EXPECT_FALSE(st[0].running);
  EXPECT_TRUE(st[0].lost);
  EXPECT_EQ(st[0].lost_why, lost);
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(lost_calls.size(), 1u);
  EXPECT_EQ(lost_calls[0], lost);
}

TEST(ChildProcesses, WithRestartsOffTheFirstExitLosesTheChild) {
  ChildProcesses children;
  ASSERT_TRUE(children.spawn_self({"--gtest_filter=NoSuchTest.Exists"}, "test worker 1").ok());
  children.watch(RestartPolicy{}, {}, {});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (children.lost().empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_NE(children.lost().find("test worker 1"), std::string::npos) << children.lost();
  EXPECT_NE(children.lost().find("restarts are off"), std::string::npos) << children.lost();
  EXPECT_EQ(children.states()[0].restarts, 0);
}

// While a child keeps running nothing is lost (the on_lost hook never runs).
TEST(ChildProcesses, ARunningChildIsNotLost) {
  ChildProcesses children;
  // This binary again, sleeping in a test of its own for a while.
  ASSERT_TRUE(children.spawn_self({std::string("--gtest_filter=") + kSleeperFilter}, "sleeper").ok());
  bool called = false;
  children.watch(RestartPolicy{}, {}, [&](const std::string&) { called = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(children.lost().empty()) << children.lost();
  EXPECT_TRUE(children.states()[0].running);
  children.stop_all();  // SIGTERM: stopped by us, not lost
  EXPECT_TRUE(children.lost().empty()) << children.lost();
  EXPECT_FALSE(called);
}

// stop(name) ends one child for good: not restarted (restarts on), not lost, not listed; the
// other keeps running; a second stop of it, or of a name never started, is not_found.
TEST(ChildProcesses, StopOneEndsThatChildOnly) {
  ChildProcesses children;
  const std::string sleeper = std::string("--gtest_filter=") + kSleeperFilter;
  ASSERT_TRUE(children.spawn_self({sleeper}, "sleeper a").ok());
  ASSERT_TRUE(children.spawn_self({sleeper}, "sleeper b").ok());
  bool called = false;
  RestartPolicy p;
  p.max_per_minute = 5;
  p.backoff_ms = 20;
  children.watch(p, {}, [&](const std::string&) { called = true; });
  children.mark_ready();
  ASSERT_TRUE(children.stop("sleeper a").is_ok());
  EXPECT_EQ(children.stop("sleeper a").code(), StatusCode::not_found);
  EXPECT_EQ(children.stop("nobody").code(), StatusCode::not_found);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // a restart would have come by now
  const auto st = children.states();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].name, "sleeper b");
  EXPECT_TRUE(st[0].running);
  EXPECT_EQ(st[0].restarts, 0);
  EXPECT_TRUE(children.lost().empty()) << children.lost();
  EXPECT_FALSE(called);
}

// Run as a child by ARunningChildIsNotLost with exactly kSleeperFilter (which no test runner
// passes); in any other run it returns at once.
TEST(ChildProcessesHelper, SleepsWhenAsked) {
  if (::testing::GTEST_FLAG(filter) == kSleeperFilter) std::this_thread::sleep_for(std::chrono::seconds(30));
}

}  // namespace
}  // namespace afd::cli
