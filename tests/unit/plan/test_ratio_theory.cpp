// Reproduces the A/F ratio paper's r* values within 2%, and checks the lemma /
// horizon-average formulas against direct summation.
#include <gtest/gtest.h>

#include <cmath>

#include "plan/ratio_theory.h"

namespace afd::plan::test_ratio_theory {
namespace {

::testing::AssertionResult within(double got, double want, double tol) {
  const double rel = std::fabs(got - want) / std::fabs(want);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", paper " << want << " (rel. error " << rel * 100 << "%)";
}

RatioWorkload wl(int64_t b, double mp, double md) { return {b, mp, md, 10000}; }

// A/F ratio paper, §5.3: baseline B = 256, μ_D = 500, μ_P = 100, N = 10,000: r* ≈ 9.3.
TEST(RatioTheory, BaselineOptimum) {
  const RatioResult r = optimal_ratio(af_ratio_paper_profile(), wl(256, 100, 500));
  EXPECT_TRUE(within(r.r_star, 9.3, 0.02));
  EXPECT_EQ(r.regime, Regime::attention_bound);
  // Throughput (eq. 20) equals eq. (6) evaluated at r*.
  EXPECT_NEAR(r.throughput_star, throughput_per_instance(af_ratio_paper_profile(), wl(256, 100, 500), r.r_star), 1e-9);
}

// A/F ratio paper, §5.4 Figure 6: B = 128 / 256 / 512 -> r* = 7.08 / 9.34 / 10.31.
TEST(RatioTheory, BatchAblation) {
  EXPECT_TRUE(within(optimal_ratio(af_ratio_paper_profile(), wl(128, 100, 500)).r_star, 7.08, 0.02));
  EXPECT_TRUE(within(optimal_ratio(af_ratio_paper_profile(), wl(256, 100, 500)).r_star, 9.34, 0.02));
  EXPECT_TRUE(within(optimal_ratio(af_ratio_paper_profile(), wl(512, 100, 500)).r_star, 10.31, 0.02));
}

// A/F ratio paper, §5.4 Figure 7: μ_D 100 -> 2.17 (FFN-bottleneck peak); μ_P 500 -> 17.25.
TEST(RatioTheory, WorkloadAblation) {
  const RatioResult d100 = optimal_ratio(af_ratio_paper_profile(), wl(256, 100, 100));
  EXPECT_TRUE(within(d100.r_star, 2.17, 0.02));
  EXPECT_EQ(d100.regime, Regime::ffn_bound);
  EXPECT_TRUE(within(optimal_ratio(af_ratio_paper_profile(), wl(256, 500, 500)).r_star, 17.25, 0.02));
}

// Definition 4.2: the closed form equals the direct sum of eq. (11) over k < K when K is an integer.
TEST(RatioTheory, HorizonAverageMatchesDirectSum) {
  RatioWorkload w{100, 50, 9, std::nullopt};  // p = 0.1
  const double p = w.p();
  w.n_requests = 3000;  // K = N / (B p) = 300
  const double k_steps = 3000 / (100 * p);
  double sum = 0;
  for (int k = 0; k < static_cast<int>(std::lround(k_steps)); ++k) sum += expected_token_load(w, k);
  EXPECT_NEAR(horizon_avg_token_load(w), sum / std::lround(k_steps), 1e-6);
  // Proposition 4.3 limit.
  w.n_requests.reset();
  EXPECT_DOUBLE_EQ(horizon_avg_token_load(w), 100.0 * (50 + 9));
}

// Lemma 4.1: E[D_{k+1}] = (1-p)(E[D_k] + B) with D_0 = 0.
TEST(RatioTheory, LemmaRecursion) {
  RatioWorkload w{64, 0, 20, std::nullopt};
  const double p = w.p();
  double d = 0;
  for (int k = 0; k < 50; ++k) {
    EXPECT_NEAR(expected_token_load(w, k), d, 1e-9 * (1 + d));
    d = (1 - p) * (d + 64);
  }
}

TEST(RatioTheory, CommunicationRegime) {
  LatencyProfile lat = af_ratio_paper_profile();
  lat.comm = {10.0, 1000, std::nullopt};  // t_C dominates
  const RatioResult r = optimal_ratio(lat, wl(256, 100, 500));
  EXPECT_EQ(r.regime, Regime::comm_bound);
  EXPECT_NEAR(r.r_star, (10.0 * 256 + 1000 - 100) / (0.083 * 256), 1e-9);
}

}  // namespace
}  // namespace afd::plan::test_ratio_theory
