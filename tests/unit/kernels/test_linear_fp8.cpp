// linear_fp8(): every implementation (scalar, AVX2 gemv / tiles, AVX-512 gemv / table gemv /
// bf16 and f32 tiles) and the scalar reference against an f64 evaluation of the contract, on
// shapes with partial edge blocks in rows and columns, odd sizes, block-row offsets, strided x
// and y, accumulate, with and without a pool. Block quantization against its definition.
//
// Expected value: y64 = sum_c x'_c * W_c in f64, x' = x (f32 mode) or bf16(x) (bf16 mode) and
// W the exactly dequantized weight — or, on the AVX-512 bf16 tile path, whose contract rounds
// the dequantized W to bf16, round_bf16(W). Tolerance as in test_linear.cpp:
// 8 * 2^-24 * sqrt(cols) * sum |x' W| — it catches one missing or doubled term.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/linear_fp8.h"
#include "kernels/cpu/linear_fp8_kernels.h"
#include "kernels/cpu/linear_kernels.h"
#include "test_util.h"

namespace afd::kernels::test_linear_fp8 {
namespace {

using testing::isa_levels;
using testing::IsaLimitGuard;
using testing::random_vec;
using testing::test_scratch;

struct Case {
  int64_t n, rows, cols, row_offset;
};

struct Problem {
  Case c;
  int64_t x_stride, y_stride, scale_stride;
  std::vector<float> x;
  std::vector<uint8_t> q;
  std::vector<float> scale;
  std::vector<float> y_init;
  Fp8BlockWeights w() const { return {q.data(), scale.data(), scale_stride, c.row_offset}; }
};

Problem make_problem(const Case& c, uint32_t seed) {
  Problem p;
  p.c = c;
  p.x_stride = c.cols + 3;
  p.y_stride = c.rows + 5;
  p.scale_stride = (c.cols + kFp8Block - 1) / kFp8Block + 1;  // wider than needed: a view's stride
  const int64_t block_rows = (c.rows + c.row_offset + kFp8Block - 1) / kFp8Block;
  p.x = random_vec(static_cast<size_t>(c.n * p.x_stride), seed);
  std::mt19937 rng(seed + 1);
  p.q.resize(static_cast<size_t>(c.rows * c.cols));
  for (auto& b : p.q) {
    do b = static_cast<uint8_t>(rng() & 0xff);
    while ((b & 0x7f) == 0x7f);  // no NaN encodings
  }
  // Block scales spread over two decades so a wrong block index shows.
  std::uniform_real_distribution<float> ds(-3.0f, -1.0f);
  p.scale.resize(static_cast<size_t>(block_rows * p.scale_stride));
  for (auto& s : p.scale) s = std::pow(10.0f, ds(rng));
  p.y_init = random_vec(static_cast<size_t>(c.n * p.y_stride), seed + 2);
  return p;
}

double weight(const Problem& p, int64_t r, int64_t c, bool round_w) {
  const float s = p.scale[static_cast<size_t>((r + p.c.row_offset) / kFp8Block * p.scale_stride + c / kFp8Block)];
  const float w = fp8_e4m3_to_f32(p.q[static_cast<size_t>(r * p.c.cols + c)]) * s;
  return round_w ? round_bf16(w) : w;
}

void check(const Problem& p, const std::vector<float>& y, ActPrecision prec, bool round_w, bool acc,
           const std::string& what) {
  int bad = 0;
  for (int64_t i = 0; i < p.c.n; ++i) {
    for (int64_t r = 0; r < p.y_stride; ++r) {
      const float got = y[static_cast<size_t>(i * p.y_stride + r)];
      const float init = p.y_init[static_cast<size_t>(i * p.y_stride + r)];
      if (r >= p.c.rows) {
        if (got != init && bad++ < 5) ADD_FAILURE() << what << ": wrote past rows at token " << i << " col " << r;
        continue;
      }
      double s = 0, sa = 0;
      for (int64_t c = 0; c < p.c.cols; ++c) {
        float xv = p.x[static_cast<size_t>(i * p.x_stride + c)];
        if (prec == ActPrecision::bf16) xv = round_bf16(xv);
        const double t = static_cast<double>(xv) * weight(p, r, c, round_w);
        s += t;
        sa += std::fabs(t);
      }
      double tol = 8.0 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(p.c.cols)) * sa + 1e-30;
      if (acc) {
        s += init;
        tol += std::ldexp(std::fabs(s), -23);
      }
      if (!(std::fabs(got - s) <= tol) && bad++ < 5)
        ADD_FAILURE() << what << ": token " << i << " row " << r << " got " << got << " want " << s << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::string describe(const Problem& p, const std::string& impl, ActPrecision prec, bool acc, int threads) {
  return impl + " n=" + std::to_string(p.c.n) + " rows=" + std::to_string(p.c.rows) + " cols=" +
         std::to_string(p.c.cols) + " row_offset=" + std::to_string(p.c.row_offset) +
         (prec == ActPrecision::bf16 ? " act=bf16" : " act=f32") + (acc ? " accumulate" : "") +
         " threads=" + std::to_string(threads);
}

// Partial blocks in rows and columns, sizes below one block, exact multiples, odd sizes,
// block-row offsets, token counts across the gemv groups of 4 and the tile token chunk (96).
const std::vector<Case> kCases = {
    {1, 1, 1, 0},      {1, 5, 17, 0},     {2, 13, 33, 0},     {3, 37, 100, 5},   {1, 128, 128, 0},
    {4, 130, 300, 0},  {5, 257, 129, 0},  {1, 70, 1000, 127}, {7, 64, 256, 64},  {8, 19, 200, 0},
    {16, 36, 257, 3},  {64, 40, 96, 0},   {65, 33, 47, 100},  {100, 21, 385, 0}, {1, 300, 640, 0},
    {2, 129, 2048, 1}, {9, 144, 136, 16}, {33, 17, 15, 0},    {200, 18, 130, 0}, {1, 9, 2048, 0}};

TEST(LinearFp8, ReferenceMatchesF64) {
  for (ActPrecision prec : {ActPrecision::f32, ActPrecision::bf16}) {
    for (const Case& c : kCases) {
      Problem p = make_problem(c, 11);
      for (bool acc : {false, true}) {
        std::vector<float> y = p.y_init;
        ref::linear_fp8(p.x.data(), c.n, p.x_stride, p.w(), c.rows, c.cols, y.data(), p.y_stride, prec, acc);
        check(p, y, prec, false, acc, describe(p, "ref", prec, acc, 1));
      }
    }
  }
}

// Every ISA level; the gemv limit at 0 (tiles for every n), the default and "always" (gemv for
// every n); the AVX-512 gemv conversions (half, word table, byte table where VBMI exists).
TEST(LinearFp8, AllImplementationsMatchF64) {
  ThreadPool pool(2);
  const detail::Fp8Tuning saved;  // the defaults
  for (Isa isa : isa_levels()) {
    IsaLimitGuard guard(isa);
    for (int lut : {0, 1, 2}) {
      if (lut && isa != Isa::avx512) continue;
      for (int64_t gemv_max : {int64_t{0}, saved.gemv_max_n, int64_t{1} << 40}) {
        for (int64_t tile_rows : {int64_t{16}, int64_t{48}}) {
          detail::Fp8Tuning t = saved;
          t.gemv_lut = lut;
          t.tile_rows = tile_rows;
          if (gemv_max != saved.gemv_max_n) {  // else the default limits
            t.gemv_max_n = t.gemv_f32_max_n = gemv_max;
            t.gemv_max_x_bytes = t.gemv_f32_max_x_bytes = gemv_max;
          }
          for (ActPrecision prec : {ActPrecision::f32, ActPrecision::bf16}) {
            for (const Case& c : kCases) {
              Problem p = make_problem(c, 23);
              const std::string path = detail::linear_fp8_path_name(c.n, c.cols, prec, LinearOrder::fastest, t);
              const bool round_w = path == "avx512_fp8_tile_bf16" || path == "avx512_fp8_tile_pairs" ||
                                   path == "avx512_fp8_gemv_lut8";
              for (bool acc : {false, true}) {
                for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
                  std::vector<float> y = p.y_init;
                  detail::linear_fp8_tuned(p.x.data(), c.n, p.x_stride, p.w(), c.rows, c.cols, y.data(), p.y_stride,
                                           prec, tp, test_scratch(), acc, LinearOrder::fastest, t);
                  check(p, y, prec, round_w, acc,
                        describe(p, path, prec, acc, tp ? tp->size() : 1) + " isa=" + isa_name(isa) +
                            " tile_rows=" + std::to_string(tile_rows));
                }
              }
            }
          }
        }
      }
    }
  }
}

// A row's result does not depend on the pool's size or the row chunking (FFN shardings must
// compute the same numbers): bit-identical with 1, 2 and 3 threads.
TEST(LinearFp8, ResultIndependentOfThreads) {
  ThreadPool p2(2), p3(3);
  for (ActPrecision prec : {ActPrecision::f32, ActPrecision::bf16}) {
    for (const Case& c : kCases) {
      Problem p = make_problem(c, 37);
      std::vector<float> y1 = p.y_init, y2 = p.y_init, y3 = p.y_init;
      linear_fp8(p.x.data(), c.n, p.x_stride, p.w(), c.rows, c.cols, y1.data(), p.y_stride, prec, nullptr,
                 test_scratch());
      linear_fp8(p.x.data(), c.n, p.x_stride, p.w(), c.rows, c.cols, y2.data(), p.y_stride, prec, &p2, test_scratch());
      linear_fp8(p.x.data(), c.n, p.x_stride, p.w(), c.rows, c.cols, y3.data(), p.y_stride, prec, &p3, test_scratch());
      EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float))) << describe(p, "2 threads", prec, false, 2);
      EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float))) << describe(p, "3 threads", prec, false, 3);
    }
  }
}

TEST(LinearFp8, DequantizedTilesAreExact) {
  // The SIMD dequantizers give exactly fp8 * scale (f32) and its bf16 rounding.
  for (const Case& c : kCases) {
    Problem p = make_problem(c, 41);
    std::vector<float> want(static_cast<size_t>(c.rows * c.cols)), got(want.size());
    detail::fp8_dequant_rows_f32_scalar(p.w(), c.cols, 0, c.rows, want.data());
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.cols; ++k) ASSERT_EQ(want[static_cast<size_t>(r * c.cols + k)], weight(p, r, k, false));
    dequantize_fp8_blocks(p.w(), c.rows, c.cols, got.data());  // the dispatched path
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "dispatched rows=" << c.rows;
    if (detected_isa() >= Isa::avx2) {
      detail::fp8_dequant_rows_f32_avx2(p.w(), c.cols, 0, c.rows, got.data());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "avx2 rows=" << c.rows;
    }
    if (detected_isa() == Isa::avx512) {
      detail::fp8_dequant_rows_f32_avx512(p.w(), c.cols, 0, c.rows, got.data());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "avx512 rows=" << c.rows;
      std::vector<uint16_t> gb(want.size() + 7, 0x1234);
      detail::fp8_dequant_rows_bf16_avx512(p.w(), c.cols, 0, c.rows, gb.data());
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(gb[i], f32_to_bf16(want[i]).bits) << "bf16 element " << i;
      for (size_t i = want.size(); i < gb.size(); ++i) ASSERT_EQ(gb[i], 0x1234) << "bf16 dequant wrote past the tile";
    }
  }
}

TEST(QuantizeFp8Blocks, MatchesDefinitionWithPartialBlocks) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {5, 300}, {130, 129}, {256, 128}, {300, 17}}) {
    std::vector<float> w = random_vec(static_cast<size_t>(rows * cols), 5);
    const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    // Different magnitudes per block; one all-zero block when there is more than one.
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t b = (r / 128) * bc + c / 128;
        float& v = w[static_cast<size_t>(r * cols + c)];
        v *= std::pow(4.0f, static_cast<float>(b % 5) - 2.0f);
        if (br * bc > 1 && b == 1) v = 0.0f;
      }
    std::vector<uint8_t> q(w.size());
    std::vector<float> s(static_cast<size_t>(br * bc));
    quantize_fp8_blocks(w.data(), rows, cols, q.data(), s.data());
    for (int64_t b = 0; b < br * bc; ++b) {
      const int64_t r0 = (b / bc) * 128, c0 = (b % bc) * 128;
      float amax = 0;
      for (int64_t r = r0; r < std::min(rows, r0 + 128); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + 128); ++c) amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * cols + c)]));
      ASSERT_EQ(s[static_cast<size_t>(b)], amax > 0 ? amax / 448.0f : 1.0f) << "block " << b;
    }
    bool saw_448 = false;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        const float sc = s[static_cast<size_t>((r / 128) * bc + c / 128)];
        ASSERT_EQ(q[i], f32_to_fp8_e4m3(w[i] / sc)) << "element " << r << "," << c;
        ASSERT_NE(q[i] & 0x7f, 0x7f) << "NaN encoding written";
        saw_448 |= (q[i] & 0x7f) == 0x7e;
        // |dequantized - w| <= half an e4m3 step at that magnitude (2^-4 relative, 2^-10 s absolute).
        const float d = fp8_e4m3_to_f32(q[i]) * sc;
        ASSERT_LE(std::fabs(d - w[i]), std::max(std::fabs(w[i]) * 0.0625f, sc * std::ldexp(1.0f, -10)) * 1.0001f);
      }
    EXPECT_TRUE(saw_448) << "each block's amax element maps to +-448";
  }
}

TEST(LinearFp8Dispatch, PathFollowsIsaAndN) {
  const detail::Fp8Tuning t;  // the defaults, which linear_fp8_path_name reports
  {
    IsaLimitGuard g(Isa::scalar);
    EXPECT_STREQ(linear_fp8_path_name(1, 128, ActPrecision::f32), "scalar_fp8");
  }
  if (detected_isa() >= Isa::avx2) {
    IsaLimitGuard g(Isa::avx2);
    EXPECT_STREQ(linear_fp8_path_name(1, 128, ActPrecision::bf16), "avx2_fp8_gemv");
    EXPECT_STREQ(linear_fp8_path_name(t.gemv_f32_max_n + 1, 128, ActPrecision::bf16), "avx2_fp8_tile_f32");
  }
  if (detected_isa() == Isa::avx512) {
    EXPECT_STREQ(linear_fp8_path_name(1, 128, ActPrecision::f32), "avx512_fp8_gemv");
    const bool lut8 = t.gemv_lut == 2 && detail::cpu_has_avx512_vbmi();
    EXPECT_STREQ(linear_fp8_path_name(1, 128, ActPrecision::bf16), lut8 ? "avx512_fp8_gemv_lut8" : "avx512_fp8_tile_bf16");
    EXPECT_STREQ(linear_fp8_path_name(t.gemv_max_n + 1, 128, ActPrecision::bf16), "avx512_fp8_tile_bf16");
    EXPECT_STREQ(linear_fp8_path_name(t.gemv_f32_max_n + 1, 128, ActPrecision::f32), "avx512_fp8_tile_f32");
    // Many tokens and even columns: the dequantized tiles go to the pairs kernel, as bf16 W does.
    const int64_t many = std::max(t.gemv_max_n + 1, detail::resolve_pairs_min_n({}));
    EXPECT_STREQ(linear_fp8_path_name(many, 128, ActPrecision::bf16), "avx512_fp8_tile_pairs");
    EXPECT_STREQ(linear_fp8_path_name(many, 127, ActPrecision::bf16), "avx512_fp8_tile_bf16");
    // A few tokens whose x rows outgrow the gemv's budget take the tiles; one token never does.
    if (t.gemv_max_n >= 4 && lut8) {
      const int64_t wide = t.gemv_max_x_bytes / 8 + 128;  // 4 bf16 rows of x exceed the budget
      EXPECT_STREQ(linear_fp8_path_name(4, 2048, ActPrecision::bf16), "avx512_fp8_gemv_lut8");
      EXPECT_STREQ(linear_fp8_path_name(4, wide, ActPrecision::bf16), "avx512_fp8_tile_bf16");
      EXPECT_STREQ(linear_fp8_path_name(1, 1 << 20, ActPrecision::bf16), "avx512_fp8_gemv_lut8");
    }
  }
}

}  // namespace
}  // namespace afd::kernels::test_linear_fp8
