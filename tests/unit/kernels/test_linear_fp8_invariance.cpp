// Batch invariance of linear_fp8() and of linear()'s AVX2 tiles: one token's output row is
// bit-identical (memcmp, sign of zero included) whatever the number of tokens n in the call, the
// token's index among them, the other tokens, the pool's size and the tuning, for every path
// (kernels/cpu/linear_fp8_kernels.h and linear_kernels.h state the orders). Each batch takes its
// tokens from a pool of random rows at a varying offset, so a token's index changes with n.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/linear_fp8.h"
#include "kernels/cpu/linear_fp8_kernels.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace afd::kernels::test_linear_fp8_invariance {
namespace {

using testing::IsaLimitGuard;
using testing::random_vec;
using testing::test_scratch;

const std::vector<int64_t> kNs = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 65, 100, 257};
constexpr int64_t kTokenPool = 300;  // >= max(kNs) + the largest batch offset

struct Shape {
  int64_t rows, cols, row_offset;
};
// Columns that are and are not multiples of 8 / 32 / 64 / 128, small and long rows; rows that
// straddle scale rows (row_offset) and span several 16-row thread chunks.
const std::vector<Shape> kShapes = {{9, 1, 0},     {37, 7, 5},    {40, 31, 0},   {33, 32, 100}, {70, 33, 0},
                                    {48, 64, 0},   {35, 100, 3},  {64, 128, 0},  {50, 129, 64}, {41, 200, 0},
                                    {130, 257, 1}, {96, 640, 0},  {36, 1000, 127}, {160, 2048, 0}};

// A batch of n tokens starting at token `first` of the pool (rows x_stride apart).
int64_t batch_first(int64_t n) { return (n * 7) % (kTokenPool - n + 1); }

struct Fp8Problem {
  Shape s;
  std::vector<uint8_t> q;
  std::vector<float> scale;
  int64_t scale_stride;
  Fp8BlockWeights w() const { return {q.data(), scale.data(), scale_stride, s.row_offset}; }
};

Fp8Problem make_fp8(const Shape& s, uint32_t seed) {
  Fp8Problem p{s, {}, {}, (s.cols + kFp8Block - 1) / kFp8Block};
  std::mt19937 rng(seed);
  p.q.resize(static_cast<size_t>(s.rows * s.cols));
  for (auto& b : p.q) {
    do b = static_cast<uint8_t>(rng() & 0xff);
    while ((b & 0x7f) == 0x7f);
  }
  std::uniform_real_distribution<float> ds(-3.0f, -1.0f);
  p.scale.resize(static_cast<size_t>((s.rows + s.row_offset + kFp8Block - 1) / kFp8Block * p.scale_stride));
  for (auto& v : p.scale) v = std::pow(10.0f, ds(rng));
  return p;
}

// Runs f(x, n, y) for n = 1 on every token alone and for each n of kNs on a batch, and expects
// every batch row to equal its token's single-token row bit for bit. y starts as y_init (the
// rows the call accumulates into when acc).
template <class F>
void expect_invariant(int64_t rows, int64_t cols, const F& f, const std::string& what) {
  const int64_t x_stride = cols + 3, y_stride = rows + 5;
  const std::vector<float> x = random_vec(static_cast<size_t>(kTokenPool * x_stride), 1000 + static_cast<uint32_t>(cols));
  const std::vector<float> y_init = random_vec(static_cast<size_t>(kTokenPool * y_stride), 2000 + static_cast<uint32_t>(rows));
  std::vector<float> single = y_init;
  for (int64_t t = 0; t < kTokenPool; ++t) f(x.data() + t * x_stride, 1, x_stride, single.data() + t * y_stride, y_stride);
  int bad = 0;
  for (int64_t n : kNs) {
    const int64_t first = batch_first(n);
    std::vector<float> y(y_init.begin() + first * y_stride, y_init.begin() + (first + n) * y_stride);
    f(x.data() + first * x_stride, n, x_stride, y.data(), y_stride);
    for (int64_t i = 0; i < n; ++i) {
      if (std::memcmp(&y[static_cast<size_t>(i * y_stride)], &single[static_cast<size_t>((first + i) * y_stride)],
                      static_cast<size_t>(rows) * sizeof(float)) != 0) {
        if (bad++ < 3) {
          int64_t r = 0;
          while (std::memcmp(&y[static_cast<size_t>(i * y_stride + r)],
                             &single[static_cast<size_t>((first + i) * y_stride + r)], sizeof(float)) == 0)
            ++r;
          ADD_FAILURE() << what << ": n=" << n << " token " << i << " (pool " << first + i << ") row " << r << " got "
                        << y[static_cast<size_t>(i * y_stride + r)] << " want "
                        << single[static_cast<size_t>((first + i) * y_stride + r)];
        }
        break;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::string shape_name(const Shape& s) {
  return "rows=" + std::to_string(s.rows) + " cols=" + std::to_string(s.cols) + " row_offset=" + std::to_string(s.row_offset);
}

// linear_fp8 at the current ISA level with `tuning`, every shape, pools of 1 / 2 / 3, acc on and off.
void check_fp8(ActPrecision prec, const std::string& what, LinearOrder order = LinearOrder::fastest,
               const detail::Fp8Tuning& tuning = {}) {
  ThreadPool p2(2), p3(3);
  for (const Shape& s : kShapes) {
    const Fp8Problem p = make_fp8(s, 7 + static_cast<uint32_t>(s.cols));
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p2, &p3})
      for (bool acc : {false, true})
        expect_invariant(
            s.rows, s.cols,
            [&](const float* x, int64_t n, int64_t xs, float* y, int64_t ys) {
              detail::linear_fp8_tuned(x, n, xs, p.w(), s.rows, s.cols, y, ys, prec, pool, test_scratch(), acc, order,
                                       tuning);
            },
            what + " " + shape_name(s) + " threads=" + std::to_string(pool ? pool->size() : 1) + (acc ? " acc" : "") +
                (prec == ActPrecision::bf16 ? " act=bf16" : " act=f32"));
  }
}

constexpr int64_t kAlways = int64_t{1} << 40;

// The default tuning with both gemvs' limits (n and x bytes) at `max` and the tiles' rows (-1:
// the default); gemv_lut as given (-1: the default).
detail::Fp8Tuning fp8_gemv_limits(int gemv_lut, int64_t max, int64_t tile_rows) {
  detail::Fp8Tuning t;
  if (gemv_lut >= 0) t.gemv_lut = gemv_lut;
  t.gemv_max_n = t.gemv_f32_max_n = t.gemv_max_x_bytes = t.gemv_f32_max_x_bytes = max;
  if (tile_rows >= 0) t.tile_rows = tile_rows;
  return t;
}

// AVX2 (gemv at few tokens, dequantized f32 tiles above): every path and tuning, both precisions.
TEST(LinearFp8Invariance, Avx2EveryPathAndTuning) {
  if (detected_isa() < Isa::avx2) GTEST_SKIP() << "no AVX2";
  IsaLimitGuard isa(Isa::avx2);
  for (ActPrecision prec : {ActPrecision::bf16, ActPrecision::f32}) {
    check_fp8(prec, "avx2 default");
    check_fp8(prec, "avx2 gemv", LinearOrder::fastest, fp8_gemv_limits(-1, kAlways, 16));  // the gemv at every n
    check_fp8(prec, "avx2 tiles", LinearOrder::fastest, fp8_gemv_limits(-1, 0, 48));  // the tiles at every n
  }
}

// The AVX-512 byte-table gemv (VBMI) taking every n.
TEST(LinearFp8Invariance, Avx512GemvEveryN) {
  if (detected_isa() < Isa::avx512 || !detail::cpu_has_avx512_vbmi()) GTEST_SKIP() << "no AVX-512 BF16 + VBMI";
  check_fp8(ActPrecision::bf16, "avx512 gemv", LinearOrder::fastest, fp8_gemv_limits(2, kAlways, -1));
}

// The AVX-512 fast paths share linear()'s bf16 order on W rounded to bf16 after scaling: the
// gemv (every n) equals, token by token, linear() on those bf16 weights where linear() already
// follows that order (4 tokens), and the tiles (every n) equal linear() at the same n. So FP8 is
// batch-invariant wherever linear()'s bf16 kernels are.
TEST(LinearFp8Invariance, Avx512SharesTheBf16Order) {
  if (detected_isa() < Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16";
  ThreadPool p3(3);
  for (const Shape& s : kShapes) {
    const Fp8Problem p = make_fp8(s, 11 + static_cast<uint32_t>(s.cols));
    std::vector<float> wf(static_cast<size_t>(s.rows * s.cols));
    dequantize_fp8_blocks(p.w(), s.rows, s.cols, wf.data());
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]).bits;
    const int64_t n_max = 65, xs = s.cols + 3, ys = s.rows + 5;
    const std::vector<float> x = random_vec(static_cast<size_t>(n_max * xs), 3);
    const std::vector<float> y0 = random_vec(static_cast<size_t>(n_max * ys), 4);
    for (bool acc : {false, true}) {
      // Reference per token: linear() at n = 4 (the token four times), its bf16 small-n tile
      // (1 row x 4 tokens, the reduce4 tree; no column blocks at these widths).
      std::vector<float> want = y0;
      for (int64_t t = 0; t < n_max; ++t) {
        std::vector<float> x4(static_cast<size_t>(4 * xs)), y4(static_cast<size_t>(4 * ys));
        for (int k = 0; k < 4; ++k) {
          std::copy(x.begin() + t * xs, x.begin() + (t + 1) * xs, x4.begin() + k * xs);
          std::copy(y0.begin() + t * ys, y0.begin() + (t + 1) * ys, y4.begin() + k * ys);
        }
        linear(x4.data(), 4, xs, wb.data(), DType::bf16, s.rows, s.cols, y4.data(), ys, ActPrecision::bf16, nullptr,
               test_scratch(), acc);
        std::copy(y4.begin(), y4.begin() + ys, want.begin() + t * ys);
      }
      for (int lut : {2}) {
        if (!detail::cpu_has_avx512_vbmi()) break;
        const detail::Fp8Tuning gemv = fp8_gemv_limits(lut, kAlways, -1);
        for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{9}, n_max}) {
          std::vector<float> y = y0;
          detail::linear_fp8_tuned(x.data(), n, xs, p.w(), s.rows, s.cols, y.data(), ys, ActPrecision::bf16, &p3,
                                   test_scratch(), acc, LinearOrder::fastest, gemv);
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(0, std::memcmp(&y[static_cast<size_t>(i * ys)], &want[static_cast<size_t>(i * ys)],
                                     static_cast<size_t>(s.rows) * sizeof(float)))
                << "gemv lut=" << lut << " vs linear bf16, " << shape_name(s) << " n=" << n << " token " << i
                << (acc ? " acc" : "");
        }
      }
      // Tiles at every n; linear() and linear_fp8() hand the same n to the pairs kernel (linear()
      // keeps short rows on the small-n tiles longer by default).
      const detail::Fp8Tuning tiles = fp8_gemv_limits(-1, 0, -1);
      detail::LinearTuning same_pairs;
      same_pairs.pairs_min_n = detail::resolve_pairs_min_n(same_pairs);
      for (int64_t n : kNs) {
        if (n > n_max) continue;
        std::vector<float> y = y0, yl = y0;
        detail::linear_fp8_tuned(x.data(), n, xs, p.w(), s.rows, s.cols, y.data(), ys, ActPrecision::bf16, &p3,
                                 test_scratch(), acc, LinearOrder::fastest, tiles);
        detail::linear_tuned(x.data(), n, xs, wb.data(), DType::bf16, s.rows, s.cols, yl.data(), ys, ActPrecision::bf16,
                             &p3, test_scratch(), acc, same_pairs);
        ASSERT_EQ(0, std::memcmp(y.data(), yl.data(), y.size() * sizeof(float)))
            << "tiles vs linear bf16, " << shape_name(s) << " n=" << n << (acc ? " acc" : "");
      }
    }
  }
}

// The AVX-512 dispatch at every n in the batch-invariant order: the many-token tiles take
// linear()'s canonical pairs kernel (the fastest order's one-chain pairs kernel is not invariant).
TEST(LinearFp8Invariance, Avx512BatchInvariantOrder) {
  if (detected_isa() < Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16";
  check_fp8(ActPrecision::bf16, "avx512 batch-invariant", LinearOrder::batch_invariant);
}

// linear()'s AVX2 tiles, bf16 and f32 weights: through linear() at every n, the OpenBLAS
// hand-off (n >= 64 by default, not batch-invariant) switched off by its knob from n = 64 on; and
// the row kernels directly, their rows split at odd places as a pool's chunks would split them.
TEST(LinearAvx2Invariance, TilesEveryN) {
  if (detected_isa() < Isa::avx2) GTEST_SKIP() << "no AVX2";
  IsaLimitGuard isa(Isa::avx2);
  ThreadPool p2(2), p3(3);
  for (const Shape& s : kShapes) {
    std::vector<float> wf = random_vec(static_cast<size_t>(s.rows * s.cols), 5 + static_cast<uint32_t>(s.cols));
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]).bits;
    for (DType dt : {DType::bf16, DType::f32}) {
      const void* w = dt == DType::bf16 ? static_cast<const void*>(wb.data()) : static_cast<const void*>(wf.data());
      const std::string dn = dt == DType::bf16 ? " w=bf16" : " w=f32";
      for (ActPrecision prec : {ActPrecision::bf16, ActPrecision::f32})
        for (bool acc : {false, true}) {
          const std::string tag = shape_name(s) + dn + (prec == ActPrecision::bf16 ? " act=bf16" : " act=f32") +
                                  (acc ? " acc" : "");
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p2, &p3})
            expect_invariant(
                s.rows, s.cols,
                [&](const float* x, int64_t n, int64_t xs, float* y, int64_t ys) {
                  detail::LinearTuning tuning;
                  if (n >= 64) tuning.blas_min_n[dt == DType::bf16][prec == ActPrecision::bf16] = kAlways;
                  detail::linear_tuned(x, n, xs, w, dt, s.rows, s.cols, y, ys, prec, pool, test_scratch(), acc, tuning);
                },
                "linear avx2 " + tag + " threads=" + std::to_string(pool ? pool->size() : 1));
          // The row kernels directly on prepared x (prep_x_f32), rows in uneven pieces.
          expect_invariant(
              s.rows, s.cols,
              [&](const float* x, int64_t n, int64_t xs, float* y, int64_t ys) {
                const int64_t ldx = (s.cols + 31) / 32 * 32;
                std::vector<float> xp(static_cast<size_t>(n * ldx));
                detail::prep_x_f32(x, n, xs, s.cols, prec == ActPrecision::bf16, xp.data(), ldx);
                for (int64_t r0 = 0, step = 5; r0 < s.rows; r0 += step, step = step * 3 % 37 + 1) {
                  const int64_t r1 = std::min(s.rows, r0 + step);
                  if (dt == DType::bf16)
                    detail::rows_fma_bf16w_avx2(xp.data(), n, ldx, wb.data(), s.cols, r0, r1, y, ys, acc);
                  else
                    detail::rows_fma_f32w_avx2(xp.data(), n, ldx, wf.data(), s.cols, r0, r1, y, ys, acc);
                }
              },
              "rows_fma avx2 " + tag);
        }
    }
  }
}

}  // namespace
}  // namespace afd::kernels::test_linear_fp8_invariance
