#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

namespace afd::test_dtype {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is halfway between 1 and 1+2^-7: ties to even -> 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even -> 1+2^-6.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, Fp8E4M3AllValuesRoundTrip) {
  for (int v = 0; v < 256; ++v) {
    float f = fp8_e4m3_to_f32(static_cast<uint8_t>(v));
    if (std::isnan(f)) continue;
    uint8_t back = f32_to_fp8_e4m3(f);
    if (v == 0x80) { EXPECT_EQ(back, 0x80); continue; }  // -0
    EXPECT_EQ(back, v) << v;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_fp8_e4m3(1e6f), 0x7e);      // saturates
  EXPECT_EQ(f32_to_fp8_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(DType, Fp8E4M3RoundsToNearest) {
  // Every float in a range quantizes to one of its two neighbouring grid points, the nearer.
  for (float x = -500.f; x < 500.f; x += 0.0371f) {
    float q = fp8_e4m3_to_f32(f32_to_fp8_e4m3(x));
    float ax = std::fabs(x);
    if (ax >= 448.f) { EXPECT_EQ(std::fabs(q), 448.f); continue; }
    float rel = std::fabs(q - x) / std::max(ax, std::ldexp(1.0f, -6));
    EXPECT_LE(rel, 1.0f / 16.0f + 1e-6f) << x;
  }
}

TEST(DType, Names) {
  DType t;
  ASSERT_TRUE(dtype_from_name("BF16", &t));
  EXPECT_EQ(t, DType::bf16);
  EXPECT_EQ(dtype_size(t), 2u);
  EXPECT_FALSE(dtype_from_name("Q4_K", &t));
}

}  // namespace
}  // namespace afd::test_dtype
