// Element-wise kernels: what the kernel registry (test_kernel_ops) does not check — the ISA
// detection mask, the AVX-512 FP8 conversions on edge bit patterns against core/dtype.h, the
// FP8 reference's round trip, rope_neox (no scalar reference) against f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "kernels/cpu/elementwise_kernels.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace afd::kernels::test_kernels {
namespace {

using testing::random_vec;

TEST(CpuDispatch, EnvironmentMaskIsHonoured) {
  const char* dis = std::getenv("AFD_CPU_DISABLE");
  if (dis && std::string(dis) == "avx512") {
    EXPECT_FALSE(cpu_features().avx512f);
    EXPECT_NE(detected_isa(), Isa::avx512);
  }
  if (cpu_features().avx512f && cpu_features().avx512_bf16 && cpu_features().avx512bw) {
    EXPECT_EQ(detected_isa(), Isa::avx512);
  }
}

// The AVX-512 rounding to e4m3 equals core/dtype.h's f32_to_fp8_e4m3 bit for bit on every
// sign and exponent (NaN, infinities, saturation, the subnormal grid, zeros), every 11-bit
// mantissa head, and mantissa tails at and around the rounding ties of every grid (normal:
// bit 20; subnormal: bits 20..23 by exponent), plus random words; and with a scale != 1,
// dividing (dispatch) or multiplying (the KV cache).
TEST(Fp8, VectorRoundingMatchesScalarOnEdges) {
  if (detected_isa() != Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU (Isa::avx512)";
  std::vector<float> x;
  const uint32_t tails[] = {0x0u, 0x1u, 0x7ffffu, 0x80000u, 0x80001u, 0xfffffu, 0x3ffffu, 0x40000u, 0x40001u,
                            0x1ffffu, 0x20000u, 0x20001u, 0xffffu, 0x10000u, 0x10001u};
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t e = 0; e < 256; ++e)
      for (uint32_t head = 0; head < 8; ++head)  // the 3 bits e4m3 keeps
        for (uint32_t tail : tails)
          for (uint32_t mid = 0; mid < 2; ++mid)  // bit 19..: with and without the tie bit's neighbour
            x.push_back(f32_from_bits(sign << 31 | e << 23 | head << 20 | ((tail ^ (mid << 19)) & 0xfffffu)));
  uint32_t r = 12345;
  for (int i = 0; i < 200000; ++i) {
    r = r * 1664525u + 1013904223u;
    x.push_back(f32_from_bits(r));
  }
  for (float scale : {1.0f, 0.37f, 3.0e-5f, 1.0f / 448.0f}) {
    std::vector<uint8_t> q(x.size());
    detail::quantize_fp8_avx512(x.data(), scale, static_cast<int64_t>(x.size()), q.data());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(q[i], f32_to_fp8_e4m3(x[i] / scale))
          << "x bits 0x" << std::hex << f32_bits(x[i]) << " scale " << scale;
  }
  // The KV cache's form (multiply by the inverse scale), through the public entry point.
  for (float mul : {1.0f, 2.7f, 1.0f / 0.37f, 33333.0f}) {
    std::vector<uint8_t> q(x.size());
    scale_to_fp8_e4m3(x.data(), static_cast<int64_t>(x.size()), mul, q.data());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(q[i], f32_to_fp8_e4m3(x[i] * mul)) << "x bits 0x" << std::hex << f32_bits(x[i]) << " mul " << mul;
  }
  // Tails of every length up to a vector are written, and nothing past them.
  for (int64_t n = 0; n <= 17; ++n) {
    std::vector<uint8_t> q(20, 0xab);
    detail::quantize_fp8_avx512(x.data() + 1000, 1.0f, n, q.data());
    for (int64_t i = 0; i < 20; ++i) ASSERT_EQ(q[i], i < n ? f32_to_fp8_e4m3(x[1000 + i]) : 0xab) << n << " " << i;
  }
}

// The AVX-512 decoding of e4m3 (arithmetic, no table) equals core/dtype.h's for every one
// of the 256 codes (zeros, subnormals, normals, NaN) at several scales, and writes tails
// exactly.
TEST(Fp8, VectorDecodingMatchesScalarOnEveryCode) {
  if (detected_isa() != Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU (Isa::avx512)";
  std::vector<uint8_t> q(256 + 7);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>(i * 37 + 11);  // then every code below
  for (int i = 0; i < 256; ++i) q[i] = static_cast<uint8_t>(i);
  for (float scale : {1.0f, 0.37f, -2.5f, 3.0e-5f}) {
    std::vector<float> x(q.size());
    detail::dequantize_fp8_avx512(q.data(), scale, static_cast<int64_t>(q.size()), x.data());
    for (size_t i = 0; i < q.size(); ++i)
      ASSERT_EQ(f32_bits(x[i]), f32_bits(fp8_e4m3_to_f32(q[i]) * scale)) << "code " << int{q[i]} << " scale " << scale;
  }
  for (int64_t n = 0; n <= 17; ++n) {
    std::vector<float> x(20, 7.0f);
    detail::dequantize_fp8_avx512(q.data() + 100, 1.0f, n, x.data());
    for (int64_t i = 0; i < 20; ++i)
      ASSERT_EQ(f32_bits(x[i]), f32_bits(i < n ? fp8_e4m3_to_f32(q[100 + i]) : 7.0f)) << n << " " << i;
  }
}

// FP8 quantization (the reference; test_kernel_ops holds the vector path to it bit for bit): the
// round trip obeys the e4m3 rounding bound |x - x'| <= max(|x| * 2^-4, scale * 2^-10) (3 mantissa
// bits: half an ulp is 2^-4 relative; subnormal grid 2^-9 * scale), plus float slack; an all-zero
// group gets scale 1 and each group's largest magnitude maps to +-448 exactly.
TEST(Fp8, ReferenceRoundTripBound) {
  for (int64_t dim : {int64_t{128}, int64_t{256}, int64_t{2048}, int64_t{384}}) {
    for (int64_t group : {dim, int64_t{128}}) {
      const int64_t n = dim * 3;
      auto x = random_vec(static_cast<size_t>(n), 8, -4, 4);
      x[5] = 0.0f;
      x[7] = 1e-6f;
      x[9] = -300.0f;                                             // an outlier in the first group
      std::fill(x.begin() + group, x.begin() + 2 * group, 0.0f);  // an all-zero group: scale 1
      std::vector<uint8_t> q(n);
      std::vector<float> s(n / group), back(n);
      ref::quantize_fp8_e4m3(x.data(), n, group, q.data(), s.data());
      EXPECT_EQ(s[1], 1.0f);
      ref::dequantize_fp8_e4m3(q.data(), s.data(), n, group, back.data());
      for (int64_t i = 0; i < n; ++i) {
        float sc = s[i / group];
        double bound = std::max(std::fabs(x[i]) * 0.0625, sc * std::ldexp(1.0, -10)) * (1 + 1e-6);
        ASSERT_LE(std::fabs(back[i] - x[i]), bound) << "i " << i << " x " << x[i] << " scale " << sc;
      }
      // The largest magnitude of each group maps to +-448 exactly.
      EXPECT_FLOAT_EQ(std::fabs(back[9]), 300.0f);
    }
  }
}

// rope_neox against an f64 evaluation of the contract: |x' - x64| <= 2e-6 * (|x_i| + |x_i+half|).
TEST(RopeNeox, MatchesF64) {
  for (int64_t head_dim : {int64_t{2}, int64_t{64}, int64_t{128}}) {
    for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{4095}, int64_t{100000}}) {
      const int64_t heads = 3, half = head_dim / 2;
      auto x = random_vec(static_cast<size_t>(heads * head_dim), 9);
      std::vector<float> got = x;
      rope_neox(got.data(), heads, head_dim, pos, 1e6);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          double ang = static_cast<double>(pos) * std::pow(1e6, -2.0 * i / head_dim);
          double a = x[h * head_dim + i], b = x[h * head_dim + i + half];
          double w0 = a * std::cos(ang) - b * std::sin(ang), w1 = b * std::cos(ang) + a * std::sin(ang);
          double tol = 2e-6 * (std::fabs(a) + std::fabs(b));
          ASSERT_NEAR(got[h * head_dim + i], w0, tol) << "pos " << pos << " i " << i;
          ASSERT_NEAR(got[h * head_dim + i + half], w1, tol);
        }
    }
  }
}

}  // namespace
}  // namespace afd::kernels::test_kernels
