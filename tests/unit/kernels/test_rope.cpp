// YaRN frequency tables, attention-scale corrections and the two RoPE pair layouts, against
// hand-computed values (MODELS.md B6 / D2 derived checks) and the existing rope_neox.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/rope.h"

namespace afd::kernels::test_rope {
namespace {

TEST(Rope, YarnCorrectionRange) {
  int64_t lo = 0, hi = 0;
  yarn_correction_range(32, 10000, 4096, 32, 1, &lo, &hi);  // dsv3-tiny (D2)
  EXPECT_EQ(lo, 5);
  EXPECT_EQ(hi, 12);
  yarn_correction_range(64, 10000, 4096, 32, 1, &lo, &hi);  // DeepSeek-V3 (B6: 10.47 -> 10, 22.51 -> 23)
  EXPECT_EQ(lo, 10);
  EXPECT_EQ(hi, 23);
  yarn_correction_range(32, 50000, 4096, 1, 1, &lo, &hi);  // K2-style: corr(1) = 9.58 -> floor 9, ceil 10
  EXPECT_EQ(lo, 9);
  EXPECT_EQ(hi, 10);
  yarn_correction_range(8, 10000, 4096, 4096, 1e-9, &lo, &hi);  // clamped to [0, rot_dim - 1]
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 7);
}

TEST(Rope, YarnInverseFrequencies) {
  const double theta = 10000, factor = 40;
  std::vector<double> f(16);
  rope_inv_freq(32, theta, factor, 4096, 32, 1, f.data());
  for (int i = 0; i < 16; ++i) {
    const double ext = std::pow(theta, -2.0 * i / 32.0);
    // low 5, high 12: ramp = clamp((i - 5) / 7, 0, 1); inv = ext / 40 * ramp + ext * (1 - ramp)
    const double ramp = std::min(1.0, std::max(0.0, (i - 5) / 7.0));
    EXPECT_NEAR(f[i], ext / factor * ramp + ext * (1 - ramp), 1e-15 * ext) << i;
    if (i <= 5) {
      EXPECT_EQ(f[i], ext) << i;
    }
  }
  EXPECT_NEAR(f[8], std::pow(theta, -0.5) * (4.0 / 7.0 + 3.0 / 7.0 / 40.0), 1e-16);
  // K2-style (rope 32, theta 50000, factor 32, beta_fast = beta_slow = 1): low 9, high 10,
  // a one-pair ramp; values from the float64 oracle (tests/reference/mla_mfa_ref.py).
  rope_inv_freq(32, 50000, 32, 4096, 1, 1, f.data());
  EXPECT_NEAR(f[9], 0.0022742037565104413, 1e-17);
  EXPECT_NEAR(f[10], 3.6140467735726306e-05, 1e-19);
  EXPECT_NEAR(f[15], 1.2290389389574926e-06, 1e-20);
  // No scaling (factor 0): plain theta^(-2i/d).
  rope_inv_freq(32, theta, 0, 0, 0, 0, f.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(f[i], std::pow(theta, -2.0 * i / 32.0));
}

TEST(Rope, SoftmaxScaleAndAttentionFactor) {
  EXPECT_NEAR(yarn_mscale(40, 1.0), 1.3688879454113936, 1e-15);
  EXPECT_EQ(yarn_mscale(1.0, 1.0), 1.0);
  EXPECT_NEAR(yarn_softmax_scale(96, 40, 1.0), 0.191249, 1e-6);   // dsv3-tiny (D2)
  EXPECT_NEAR(yarn_softmax_scale(192, 40, 1.0), 0.135234, 1e-6);  // DeepSeek-V3 (B3)
  EXPECT_NEAR(yarn_softmax_scale(192, 40, 0.707), 0.11472, 1e-5);  // DeepSeek-V2 (B8)
  EXPECT_EQ(yarn_softmax_scale(192, 40, 0.0), 1.0 / std::sqrt(192.0));  // no mscale_all_dim
  EXPECT_NEAR(yarn_attention_factor(40, 0.707, 1.0), 0.92104, 1e-5);  // D2b V2-style
  EXPECT_EQ(yarn_attention_factor(40, 1.0, 1.0), 1.0);
}

TEST(Rope, InterleavedAndNeoxPairs) {
  const float cs[2] = {0.5f, -0.25f}, sn[2] = {0.75f, 2.0f};
  // Two rows of 6 values, stride 6, rotating the first 4.
  std::vector<float> x = {1, 2, 3, 4, 9, 9, 5, 6, 7, 8, 9, 9};
  std::vector<float> y = x;
  rope_rotate(x.data(), 2, 6, 4, cs, sn, /*interleaved=*/true);
  rope_rotate(y.data(), 2, 6, 4, cs, sn, /*interleaved=*/false);
  auto rot = [](float a, float b, float c, float s) { return std::pair<float, float>{a * c - b * s, b * c + a * s}; };
  for (int r = 0; r < 2; ++r) {
    const float* o = &x[r * 6];
    const float a0 = 1 + 4 * r, a1 = 2 + 4 * r, a2 = 3 + 4 * r, a3 = 4 + 4 * r;
    auto p0 = rot(a0, a1, cs[0], sn[0]), p1 = rot(a2, a3, cs[1], sn[1]);  // (0,1), (2,3)
    EXPECT_EQ(o[0], p0.first);
    EXPECT_EQ(o[1], p0.second);
    EXPECT_EQ(o[2], p1.first);
    EXPECT_EQ(o[3], p1.second);
    const float* u = &y[r * 6];
    auto q0 = rot(a0, a2, cs[0], sn[0]), q1 = rot(a1, a3, cs[1], sn[1]);  // (0,2), (1,3)
    EXPECT_EQ(u[0], q0.first);
    EXPECT_EQ(u[2], q0.second);
    EXPECT_EQ(u[1], q1.first);
    EXPECT_EQ(u[3], q1.second);
    EXPECT_EQ(o[4], 9);  // outside rot_dim: untouched
    EXPECT_EQ(u[5], 9);
  }
}

// Unscaled frequencies + NEOX pairs reproduce rope_neox bit for bit; the magnitude scales both.
TEST(Rope, MatchesRopeNeoxAndScalesMagnitude) {
  const int64_t hd = 16, heads = 3, pos = 1234;
  std::vector<float> a(heads * hd), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.1f * i) + 0.5f;
  b = a;
  rope_neox(a.data(), heads, hd, pos, 10000.0);
  std::vector<double> f(hd / 2);
  rope_inv_freq(hd, 10000.0, 0, 0, 0, 0, f.data());
  std::vector<float> c(hd / 2), s(hd / 2), c2(hd / 2), s2(hd / 2);
  rope_cos_sin(pos, f.data(), hd / 2, 1.0, c.data(), s.data());
  rope_rotate(b.data(), heads, hd, hd, c.data(), s.data(), false);
  EXPECT_EQ(a, b);
  rope_cos_sin(pos, f.data(), hd / 2, 0.5, c2.data(), s2.data());
  for (int64_t i = 0; i < hd / 2; ++i) {
    EXPECT_FLOAT_EQ(c2[i], 0.5f * c[i]);
    EXPECT_FLOAT_EQ(s2[i], 0.5f * s[i]);
  }
}

}  // namespace
}  // namespace afd::kernels::test_rope
