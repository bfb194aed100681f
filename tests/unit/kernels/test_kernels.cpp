// Element-wise kernels vs their scalar references, at every ISA level this CPU has.
// Tolerances are stated per test; "exact" means bit-identical.
#include <gtest/gtest.h>

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

namespace afd::kernels {
namespace {

using testing::IsaLimitGuard;
using testing::isa_levels;
using testing::random_vec;

const std::vector<int64_t> kLengths = {1, 3, 15, 16, 17, 31, 33, 64, 100, 127, 128, 129, 1000, 2048};

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

// rmsnorm: |y - ref| <= 1e-6 * |ref| + 1e-7 (the sum of squares is accumulated in f32 lanes
// instead of f64; x * inv * w is the same two roundings).
TEST(Rmsnorm, MatchesReference) {
  for (Isa isa : isa_levels()) {
    IsaLimitGuard g(isa);
    for (int64_t dim : kLengths) {
      const int64_t n = 3;
      auto x = random_vec(static_cast<size_t>(n * dim), 1, -3, 3);
      auto w = random_vec(static_cast<size_t>(dim), 2, 0.5, 1.5);
      std::vector<float> want(x.size()), got(x.size());
      ref::rmsnorm(x.data(), w.data(), n, dim, 1e-6f, want.data());
      rmsnorm(x.data(), w.data(), n, dim, 1e-6f, got.data());
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-7) << "dim " << dim << " isa " << isa_name(isa);
      // In place (y aliases x).
      std::vector<float> inplace = x;
      rmsnorm(inplace.data(), w.data(), n, dim, 1e-6f, inplace.data());
      EXPECT_EQ(inplace, got);
    }
  }
}

// silu_mul: vector exp (~2 ulp) then one division and one multiply: |out - ref| <= 1e-6 * |ref| + 1e-30.
TEST(SiluMul, MatchesReference) {
  for (Isa isa : isa_levels()) {
    IsaLimitGuard g(isa);
    for (int64_t n : kLengths) {
      auto gate = random_vec(static_cast<size_t>(n), 3, -20, 20);
      auto up = random_vec(static_cast<size_t>(n), 4, -2, 2);
      if (n > 4) gate[0] = -100.0f, gate[1] = 100.0f, gate[2] = 0.0f, gate[3] = -88.0f;
      std::vector<float> want(n), got(n);
      ref::silu_mul(gate.data(), up.data(), n, want.data());
      silu_mul(gate.data(), up.data(), n, got.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-30)
            << "i " << i << " gate " << gate[i] << " isa " << isa_name(isa);
      std::vector<float> alias = gate;  // out aliases gate
      silu_mul(alias.data(), up.data(), n, alias.data());
      EXPECT_EQ(alias, got);
    }
  }
}

// softmax: |p - ref| <= 1e-6 * ref + 1e-9; sums to 1 within 1e-5.
TEST(Softmax, MatchesReference) {
  for (Isa isa : isa_levels()) {
    IsaLimitGuard g(isa);
    for (int64_t n : kLengths) {
      auto x = random_vec(static_cast<size_t>(n), 5, -30, 30);
      std::vector<float> want = x, got = x;
      ref::softmax(want.data(), n);
      softmax(got.data(), n);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-6 * want[i] + 1e-9) << "n " << n << " isa " << isa_name(isa);
        sum += got[i];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

// The online-softmax halves: scale_max exact (one multiply each, max); exp_sub_sum within the
// exp approximation of softmax (1e-6 relative per element, 1e-5 on the sum); n = 0 gives -inf / 0.
TEST(Softmax, ScaleMaxAndExpSubSumMatchReference) {
  for (Isa isa : isa_levels()) {
    IsaLimitGuard g(isa);
    EXPECT_EQ(scale_max(nullptr, 0, 2.0f), -INFINITY);
    EXPECT_EQ(exp_sub_sum(nullptr, 0, 0.0f), 0.0f);
    for (int64_t n : kLengths) {
      auto x = random_vec(static_cast<size_t>(n), 6, -30, 30);
      std::vector<float> want = x, got = x;
      const float mw = ref::scale_max(want.data(), n, 0.37f), mg = scale_max(got.data(), n, 0.37f);
      ASSERT_EQ(mw, mg) << "n " << n << " isa " << isa_name(isa);
      ASSERT_EQ(want, got) << "n " << n << " isa " << isa_name(isa);
      const float sw = ref::exp_sub_sum(want.data(), n, mw + 0.5f), sg = exp_sub_sum(got.data(), n, mw + 0.5f);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[i], want[i], 1e-6 * want[i] + 1e-9) << "n " << n << " isa " << isa_name(isa);
      EXPECT_NEAR(sg, sw, 1e-5 * sw) << "n " << n << " isa " << isa_name(isa);
    }
  }
}

// matmul_f32: the library sgemm against the f64-accumulated reference, with strides wider than
// the rows and an empty inner dimension.
TEST(MatmulF32, MatchesReference) {
  for (auto [m, k, n] : {std::array<int64_t, 3>{1, 128, 512}, {7, 33, 17}, {64, 128, 512}, {3, 0, 5}}) {
    const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
    auto a = random_vec(static_cast<size_t>(m * lda), 7, -1, 1);
    auto b = random_vec(static_cast<size_t>(std::max<int64_t>(k, 1) * ldb), 8, -1, 1);
    std::vector<float> want(static_cast<size_t>(m * ldc), 5.0f), got = want;
    ref::matmul_f32(a.data(), m, k, lda, b.data(), n, ldb, want.data(), ldc);
    matmul_f32(a.data(), m, k, lda, b.data(), n, ldb, got.data(), ldc);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < ldc; ++j) {
        const size_t at = static_cast<size_t>(i * ldc + j);
        if (j >= n) ASSERT_EQ(got[at], 5.0f) << "wrote past the row";
        else ASSERT_NEAR(got[at], want[at], 1e-5 * (1 + k)) << m << "x" << k << "x" << n;
      }
  }
}

// axpy: exact (mul then add, as the reference).
TEST(Axpy, ExactVsReference) {
  for (Isa isa : isa_levels()) {
    IsaLimitGuard g(isa);
    for (int64_t n : kLengths) {
      auto x = random_vec(static_cast<size_t>(n), 6);
      auto y0 = random_vec(static_cast<size_t>(n), 7);
      std::vector<float> want = y0, got = y0;
      ref::axpy(0.37f, x.data(), n, want.data());
      axpy(0.37f, x.data(), n, got.data());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), n * sizeof(float))) << "n " << n;
    }
  }
}

// Conversions: exact vs core/dtype.h, over special values and a sweep of bit patterns.
TEST(Conversions, F32ToBf16ExactVsDtypeH) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -1e-45f,
                          3.4e38f, -3.4e38f, f32_from_bits(0x3f808000u), f32_from_bits(0x3f818000u),
                          f32_from_bits(0x7f7fffffu), f32_from_bits(0x7fc00001u), f32_from_bits(0x7f800001u)};
  for (uint32_t u = 0; u < 0xffffffffu - 65521u * 7; u += 65521u * 7) x.push_back(f32_from_bits(u));
  for (Isa isa : isa_levels()) {
    IsaLimitGuard g(isa);
    for (int64_t off : {int64_t{0}, int64_t{1}, int64_t{5}}) {
      const int64_t n = static_cast<int64_t>(x.size()) - off;
      std::vector<uint16_t> got(n + 1, 0xabcd);
      f32_to_bf16_row(x.data() + off, n, got.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[i], f32_to_bf16(x[off + i]).bits)
            << std::hex << "input bits " << f32_bits(x[off + i]) << " isa " << isa_name(isa);
      EXPECT_EQ(got[n], 0xabcd) << "wrote past the end";
    }
  }
}

TEST(Conversions, Bf16ToF32ExactForAllValues) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : isa_levels()) {
    IsaLimitGuard g(isa);
    std::vector<float> got(65536 + 1, 7.0f);
    bf16_to_f32_row(all.data() + 1, 65535, got.data());
    for (int i = 1; i < 65536; ++i) ASSERT_EQ(f32_bits(got[i - 1]), f32_bits(bf16_to_f32(all[i]))) << i;
    EXPECT_EQ(got[65535], 7.0f);
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

// FP8: quantize is bit-identical to the reference (q and scales); the round trip obeys the
// e4m3 rounding bound |x - x'| <= max(|x| * 2^-4, scale * 2^-10) (3 mantissa bits: half an ulp is
// 2^-4 relative; subnormal grid 2^-9 * scale), plus float slack; dequantize is exact vs reference.
TEST(Fp8, QuantizeMatchesReferenceAndRoundTripBound) {
  for (Isa isa : isa_levels()) {
    IsaLimitGuard g(isa);
    for (int64_t dim : {int64_t{128}, int64_t{256}, int64_t{2048}, int64_t{384}}) {
      for (int64_t group : {dim, int64_t{128}}) {
        const int64_t n = dim * 3;
        auto x = random_vec(static_cast<size_t>(n), 8, -4, 4);
        x[5] = 0.0f;
        x[7] = 1e-6f;
        x[9] = -300.0f;  // an outlier in the first group
        std::fill(x.begin() + group, x.begin() + 2 * group, 0.0f);  // an all-zero group: scale 1
        std::vector<uint8_t> q(n), q_ref(n);
        std::vector<float> s(n / group), s_ref(n / group), back(n), back_ref(n);
        quantize_fp8_e4m3(x.data(), n, group, q.data(), s.data());
        ref::quantize_fp8_e4m3(x.data(), n, group, q_ref.data(), s_ref.data());
        ASSERT_EQ(q, q_ref) << "dim " << dim << " group " << group << " isa " << isa_name(isa);
        ASSERT_EQ(s, s_ref);
        EXPECT_EQ(s[1], 1.0f);
        dequantize_fp8_e4m3(q.data(), s.data(), n, group, back.data());
        ref::dequantize_fp8_e4m3(q.data(), s.data(), n, group, back_ref.data());
        ASSERT_EQ(0, std::memcmp(back.data(), back_ref.data(), n * sizeof(float)));
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
}  // namespace afd::kernels
