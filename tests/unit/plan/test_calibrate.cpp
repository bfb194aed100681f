// Calibration: least-squares fit recovers known α/β, reports fit quality, and the CSV and
// sampler paths produce the same profile.
#include <gtest/gtest.h>

#include <cmath>

#include "plan/calibrate.h"
#include "plan/rng.h"

namespace afd::plan::test_calibrate {
namespace {

TEST(Calibrate, ExactLineHasZeroResiduals) {
  std::vector<double> x{1, 2, 3, 4}, y{5, 7, 9, 11}, res;
  auto m = fit_linear(x, y, &res);
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->alpha, 2.0, 1e-12);
  EXPECT_NEAR(m->beta, 3.0, 1e-12);
  EXPECT_NEAR(m->fit->r2, 1.0, 1e-12);
  EXPECT_NEAR(m->fit->max_abs_residual, 0.0, 1e-12);
  for (double r : res) EXPECT_NEAR(r, 0.0, 1e-12);
}

TEST(Calibrate, KnownLeastSquaresSolution) {
  // x = 0,1,2,3; y = 1,3,2,5: slope = Σ(x-1.5)(y-2.75)/Σ(x-1.5)^2 = 5.5/5 = 1.1, intercept
  // 2.75 - 1.65 = 1.1; residuals -0.1, 0.8, -1.3, 0.6 -> SS_res = 2.7; SS_tot = 8.75.
  auto m = fit_linear({0, 1, 2, 3}, {1, 3, 2, 5});
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->alpha, 1.1, 1e-12);
  EXPECT_NEAR(m->beta, 1.1, 1e-12);
  EXPECT_NEAR(m->fit->r2, 1.0 - 2.7 / 8.75, 1e-12);
  EXPECT_NEAR(m->fit->rmse, std::sqrt(2.7 / 4), 1e-12);
  EXPECT_NEAR(m->fit->max_abs_residual, 1.3, 1e-12);
}

TEST(Calibrate, NegativeInterceptIsClampedToBoundary) {
  auto m = fit_linear({1, 2, 3}, {0.5, 2.0, 3.5});  // unconstrained beta = -1
  ASSERT_TRUE(m.ok());
  EXPECT_GE(m->beta, 0.0);
  EXPECT_DOUBLE_EQ(m->beta, 0.0);
  EXPECT_NEAR(m->alpha, (0.5 + 4.0 + 10.5) / 14.0, 1e-12);
}

TEST(Calibrate, DegenerateInputsFail) {
  EXPECT_FALSE(fit_linear({1}, {1}).ok());
  EXPECT_FALSE(fit_linear({2, 2, 2}, {1, 2, 3}).ok());
  EXPECT_FALSE(fit_linear({1, 2}, {1}).ok());
}

// A sampler following a known linear model plus small deterministic noise: the fit recovers
// the parameters; the same samples through CSV give the same profile.
TEST(Calibrate, SweepAndCsvRecoverParameters) {
  Rng rng(5);
  const double aa = 2e-9, ba = 3e-4, af = 5e-6, bf = 8e-4, ac = 1e-6, bc = 5e-5;
  StageSampler sampler = [&](int64_t b, int64_t t) -> Result<StageSample> {
    auto noise = [&] { return 1.0 + 0.01 * (rng.uniform_open0() - 0.5); };
    StageSample s;
    s.batch = b;
    s.token_load = t;
    s.attention_s = (aa * t + ba) * noise();
    s.ffn_s = (af * b + bf) * noise();
    s.a2f_s = 0.5 * (ac * b + bc) * noise();
    s.f2a_s = 0.5 * (ac * b + bc) * noise();
    return s;
  };
  auto samples = run_calibration_sweep(sampler, SweepSpec{});
  ASSERT_TRUE(samples.ok());
  EXPECT_EQ(samples->size(), 4u * 3u * 3u);
  auto fit = fit_profile(*samples, "test");
  ASSERT_TRUE(fit.ok()) << fit.status().to_string();
  EXPECT_NEAR(fit->profile.attention.alpha, aa, 0.02 * aa);
  EXPECT_NEAR(fit->profile.ffn.alpha, af, 0.02 * af);
  EXPECT_NEAR(fit->profile.ffn.beta, bf, 0.02 * bf);
  EXPECT_NEAR(fit->profile.comm.alpha, ac, 0.05 * ac);
  EXPECT_GT(fit->profile.attention.fit->r2, 0.99);
  EXPECT_EQ(fit->attention_residuals.size(), samples->size());

  std::string csv = "# measured\nbatch,token_load,attention_s,a2f_s,ffn_s,f2a_s\n";
  char line[256];
  for (const auto& s : *samples) {
    std::snprintf(line, sizeof line, "%lld,%lld,%.17g,%.17g,%.17g,%.17g\n", static_cast<long long>(s.batch),
                  static_cast<long long>(s.token_load), s.attention_s, s.a2f_s, s.ffn_s, s.f2a_s);
    csv += line;
  }
  auto parsed = parse_samples_csv(csv, "mem.csv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  auto fit2 = fit_profile(*parsed, "test");
  ASSERT_TRUE(fit2.ok());
  EXPECT_DOUBLE_EQ(fit2->profile.attention.alpha, fit->profile.attention.alpha);
  EXPECT_DOUBLE_EQ(fit2->profile.ffn.beta, fit->profile.ffn.beta);
}

TEST(Calibrate, CsvErrorsNameTheLine) {
  auto r = parse_samples_csv("batch,token_load,attention_s,a2f_s,ffn_s,f2a_s\n4,100,0.1,0,0.2,x\n", "s.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("s.csv:2"), std::string::npos);
  EXPECT_FALSE(parse_samples_csv("batch,token_load\n1,2\n", "s.csv").ok());     // missing columns
  EXPECT_FALSE(parse_samples_csv("batch,token_load,attention_s,a2f_s,ffn_s,f2a_s\n", "s.csv").ok());  // no rows
  EXPECT_FALSE(parse_samples_csv("batch,token_load,attention_s,a2f_s,ffn_s,f2a_s\n1,2,3\n", "s.csv").ok());
}

}  // namespace
}  // namespace afd::plan::test_calibrate
