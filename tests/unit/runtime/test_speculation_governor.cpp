// SpeculationGovernor (runtime/speculation_governor.h): per batch-size bucket it tries both
// sides, then runs the faster one and explores the other now and then, and follows a change.
#include <gtest/gtest.h>

#include "runtime/speculation_governor.h"

namespace afd::test_speculation_governor {
namespace {

// Runs `steps` decode steps of n sequences where drafting gives `on` tokens/s and not drafting
// `off` tokens/s; returns how many of the last `tail` steps drafted.
int64_t run(SpeculationGovernor& g, int64_t n, double on, double off, int steps, int tail) {
  int64_t drafted = 0;
  for (int i = 0; i < steps; ++i) {
    const bool d = g.use_drafts(n);
    g.record(n, d, 1.0, static_cast<int64_t>(d ? on : off));
    if (i >= steps - tail) drafted += d;
  }
  return drafted;
}

TEST(SpeculationGovernor, BucketsArePowersOfTwo) {
  EXPECT_EQ(SpeculationGovernor::bucket(1), 0);
  EXPECT_EQ(SpeculationGovernor::bucket(2), 1);
  EXPECT_EQ(SpeculationGovernor::bucket(3), 2);
  EXPECT_EQ(SpeculationGovernor::bucket(4), 2);
  EXPECT_EQ(SpeculationGovernor::bucket(5), 3);
  EXPECT_EQ(SpeculationGovernor::bucket(64), 6);
  EXPECT_EQ(SpeculationGovernor::bucket(65), 7);
  EXPECT_EQ(SpeculationGovernor::bucket(100000), 7);
}

TEST(SpeculationGovernor, DraftsWhereTheyPayAndNotWhereTheyDoNot) {
  SpeculationGovernor g;
  EXPECT_EQ(g.summary(), "warming up");
  // Batch 1: drafts give 150 tokens/s against 100. Batch 64: 900 against 1000.
  const int64_t small = run(g, 1, 150, 100, 200, 160);
  const int64_t large = run(g, 64, 900, 1000, 200, 160);
  EXPECT_EQ(g.preferred(0), 1);
  EXPECT_EQ(g.preferred(6), -1);
  // The preferred side runs except one step in 16 (exploration).
  EXPECT_EQ(small, 160 - 10);
  EXPECT_EQ(large, 10);
  EXPECT_EQ(g.summary(), "1:on 33-64:off");
  EXPECT_EQ(g.preferred(3), 0);  // a bucket never seen keeps warming up
}

TEST(SpeculationGovernor, WarmsUpBothSidesFirst) {
  SpeculationGovernor g({.warmup = 3, .explore_every = 16, .smoothing = 0.2});
  int on = 0, off = 0;
  for (int i = 0; i < 6; ++i) {
    const bool d = g.use_drafts(8);
    (d ? on : off) += 1;
    g.record(8, d, 1.0, 100);
  }
  EXPECT_EQ(on, 3);
  EXPECT_EQ(off, 3);
}

TEST(SpeculationGovernor, FollowsAChangeThroughExploration) {
  SpeculationGovernor g;
  run(g, 4, 300, 100, 100, 1);  // drafts pay (a repetitive text)...
  EXPECT_EQ(g.preferred(2), 1);
  run(g, 4, 50, 100, 400, 1);  // ... then stop paying (new text): the explored side's rate wins
  EXPECT_EQ(g.preferred(2), -1);
}

TEST(SpeculationGovernor, LongStepsCountByTheirTime) {
  // With drafts, steps alternate 1 s and 9 s for 10 tokens each: 20 tokens in 10 s, 2 tokens/s
  // (the mean of the steps' rates would say 5.6). Without: 3 tokens/s. Not drafting wins.
  SpeculationGovernor g;
  int drafted = 0;
  for (int i = 0; i < 400; ++i) {
    const bool d = g.use_drafts(16);
    g.record(16, d, d ? (drafted++ % 2 == 0 ? 1.0 : 9.0) : 1.0, d ? 10 : 3);
  }
  EXPECT_EQ(g.preferred(SpeculationGovernor::bucket(16)), -1);
  EXPECT_NEAR(g.rate(SpeculationGovernor::bucket(16), true), 2.0, 0.6);
}

TEST(SpeculationGovernor, IgnoresStepsWithoutTime) {
  SpeculationGovernor g({.warmup = 1, .explore_every = 16, .smoothing = 0.2});
  g.record(1, true, 0.0, 100);
  g.record(1, false, -1.0, 100);
  EXPECT_EQ(g.preferred(0), 0);
  g.record(1, true, 1.0, 10);
  g.record(1, false, 1.0, 20);
  EXPECT_EQ(g.preferred(0), -1);
  EXPECT_DOUBLE_EQ(g.rate(0, true), 10.0);
}

}  // namespace
}  // namespace afd::test_speculation_governor
