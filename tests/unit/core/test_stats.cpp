#include "core/stats.h"

#include <gtest/gtest.h>

namespace afd::test_stats {
namespace {

TEST(Stats, QuantileInterpolatesBetweenRanks) {
  const std::vector<double> v = {5, 1, 4, 2, 3};  // sorted: 1 2 3 4 5
  EXPECT_DOUBLE_EQ(quantile(v, 0.5), 3.0);
  EXPECT_DOUBLE_EQ(quantile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(quantile(v, 1.0), 5.0);
  EXPECT_DOUBLE_EQ(quantile(v, 0.9), 4.6);   // pos 3.6: 4 + 0.6 * (5 - 4)
  EXPECT_DOUBLE_EQ(quantile({1, 2}, 0.5), 1.5);
  EXPECT_DOUBLE_EQ(quantile({}, 0.5), 0.0);
  EXPECT_DOUBLE_EQ(quantile({7}, 0.99), 7.0);
}

TEST(Stats, MedianIsTheMiddleOrTheMeanOfTheTwoMiddleValues) {
  EXPECT_DOUBLE_EQ(median({5, 1, 4, 2, 3}), 3.0);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({0.25, 0.75}), 0.5);
  EXPECT_DOUBLE_EQ(median({7}), 7.0);
  EXPECT_DOUBLE_EQ(median({}), 0.0);
  const std::vector<double> v = {9, 8, 1};
  EXPECT_DOUBLE_EQ(median(v), 8.0);
  EXPECT_EQ(v, (std::vector<double>{9, 8, 1}));  // the caller's samples keep their order
}

TEST(Stats, SummaryOfASlowTail) {
  std::vector<double> v(100, 1.0);
  for (int i = 0; i < 10; ++i) v[i] = 10.0;  // 10 % slow steps
  const SampleSummary s = summarize(v);
  EXPECT_EQ(s.n, 100u);
  EXPECT_DOUBLE_EQ(s.median, 1.0);
  EXPECT_GT(s.p90, 1.0);  // the 90th percentile sits on the slow tail's edge
  EXPECT_DOUBLE_EQ(s.p99, 10.0);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 10.0);
  EXPECT_DOUBLE_EQ(s.mean, 1.9);
}

}  // namespace
}  // namespace afd::test_stats
