// linear(): every implementation (scalar, AVX2, AVX-512 tiles, OpenBLAS) against an f64
// evaluation of the same contract, plus the scalar reference ref::linear against it too.
//
// Tolerance: |y - y64| <= 8 * 2^-24 * sqrt(cols) * sum_c |x_c * w_c| (+1e-30), where x_c is
// already rounded to bf16 in bf16 mode. Float summation in any order has a typical error of
// about 2^-24 * sum|x w| on random data; the bound leaves a factor 8*sqrt(cols) of headroom
// and still catches one missing or doubled term (~sum|x w| / cols) for cols <= 1000.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace afd::kernels::test_linear {
namespace {

using testing::isa_levels;
using testing::IsaLimitGuard;
using testing::random_vec;
using testing::test_scratch;

struct Case {
  int64_t n, rows, cols;
};

struct Problem {
  int64_t n, rows, cols, x_stride, y_stride;
  DType w_dtype;
  ActPrecision prec;
  std::vector<float> x;       // [n, x_stride]
  std::vector<uint16_t> wb;   // [rows, cols] when bf16
  std::vector<float> wf;      // [rows, cols] when f32
  std::vector<double> y64;    // [n, rows] f64 value of the contract
  std::vector<double> tol;    // [n, rows]
  std::vector<float> y_init;  // [n, y_stride] initial contents of y (for accumulate)

  const void* w() const { return w_dtype == DType::bf16 ? static_cast<const void*>(wb.data()) : wf.data(); }
};

Problem make_problem(const Case& c, DType w_dtype, ActPrecision prec, uint32_t seed) {
  Problem p;
  p.n = c.n, p.rows = c.rows, p.cols = c.cols;
  p.x_stride = c.cols + 3;
  p.y_stride = c.rows + 5;
  p.w_dtype = w_dtype;
  p.prec = prec;
  p.x = random_vec(static_cast<size_t>(p.n * p.x_stride), seed);
  std::vector<float> w = random_vec(static_cast<size_t>(p.rows * p.cols), seed + 1);
  if (w_dtype == DType::bf16) {
    p.wb.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      p.wb[i] = f32_to_bf16(w[i]).bits;
      w[i] = bf16_to_f32(p.wb[i]);
    }
  } else {
    p.wf = w;
  }
  p.y_init = random_vec(static_cast<size_t>(p.n * p.y_stride), seed + 2);
  p.y64.resize(static_cast<size_t>(p.n * p.rows));
  p.tol.resize(p.y64.size());
  for (int64_t i = 0; i < p.n; ++i)
    for (int64_t r = 0; r < p.rows; ++r) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < p.cols; ++k) {
        float xv = p.x[i * p.x_stride + k];
        if (prec == ActPrecision::bf16) xv = round_bf16(xv);
        double t = static_cast<double>(xv) * w[r * p.cols + k];
        s += t;
        sa += std::fabs(t);
      }
      p.y64[i * p.rows + r] = s;
      p.tol[i * p.rows + r] = 8.0 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(p.cols)) * sa + 1e-30;
    }
  return p;
}

// Checks y [n, y_stride] against the contract; with accumulate, y started as y_init.
void check(const Problem& p, const std::vector<float>& y, bool accumulate, const std::string& what) {
  int bad = 0;
  for (int64_t i = 0; i < p.n; ++i) {
    for (int64_t r = 0; r < p.y_stride; ++r) {
      float got = y[i * p.y_stride + r];
      if (r >= p.rows) {  // padding beyond rows must be untouched
        if (got != p.y_init[i * p.y_stride + r] && bad++ < 5)
          ADD_FAILURE() << what << ": wrote past rows at token " << i << " col " << r;
        continue;
      }
      double want = p.y64[i * p.rows + r];
      double tol = p.tol[i * p.rows + r];
      if (accumulate) {
        want += p.y_init[i * p.y_stride + r];
        tol += std::ldexp(std::fabs(want), -23);
      }
      if (!(std::fabs(got - want) <= tol) && bad++ < 5)
        ADD_FAILURE() << what << ": token " << i << " row " << r << " got " << got << " want " << want
                      << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::string describe(const Problem& p, const char* impl, bool acc, int threads) {
  return std::string(impl) + " n=" + std::to_string(p.n) + " rows=" + std::to_string(p.rows) +
         " cols=" + std::to_string(p.cols) + " w=" + dtype_name(p.w_dtype) +
         (p.prec == ActPrecision::bf16 ? " act=bf16" : " act=f32") + (acc ? " accumulate" : "") +
         " threads=" + std::to_string(threads);
}

const std::vector<Case> kCases = {
    {1, 1, 1},     {1, 5, 17},     {2, 13, 33},   {3, 37, 100},  {7, 64, 129},  {1, 70, 1000},
    {8, 19, 64},   {13, 41, 31},   {16, 36, 257}, {5, 3, 2048},  {64, 40, 96},  {65, 33, 47},
    {100, 21, 65}, {200, 18, 130}, {1, 130, 513}, {1, 9, 2048}, {1, 17, 64}, {4, 21, 300}, {2, 7, 2048}};

class LinearTest : public ::testing::TestWithParam<std::tuple<DType, ActPrecision>> {};

TEST_P(LinearTest, ReferenceMatchesF64) {
  auto [w_dtype, prec] = GetParam();
  for (const Case& c : kCases) {
    Problem p = make_problem(c, w_dtype, prec, 11);
    for (bool acc : {false, true}) {
      std::vector<float> y = p.y_init;
      ref::linear(p.x.data(), p.n, p.x_stride, p.w(), p.w_dtype, p.rows, p.cols, y.data(), p.y_stride, prec,
                  acc);
      check(p, y, acc, describe(p, "ref", acc, 1));
    }
  }
}

// Every ISA level, with the OpenBLAS threshold at its default, forced to 1 (BLAS for every n)
// and to "never" (tile kernels for every n, incl. token chunks > kTokenChunk).
TEST_P(LinearTest, AllImplementationsMatchF64) {
  auto [w_dtype, prec] = GetParam();
  const bool wb = w_dtype == DType::bf16, ab = prec == ActPrecision::bf16;
  ThreadPool pool(2);
  for (Isa isa : isa_levels()) {
    IsaLimitGuard guard(isa);
    for (int64_t blas_min : {int64_t{-1}, int64_t{1}, int64_t{1} << 40}) {  // -1: the default
      detail::LinearTuning tuning;
      tuning.blas_min_n[wb][ab] = blas_min;
      for (const Case& c : kCases) {
        Problem p = make_problem(c, w_dtype, prec, 23);
        for (bool acc : {false, true}) {
          for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::vector<float> y = p.y_init;
            detail::linear_tuned(p.x.data(), p.n, p.x_stride, p.w(), p.w_dtype, p.rows, p.cols, y.data(), p.y_stride,
                                 prec, tp, test_scratch(), acc, tuning);
            check(p, y, acc,
                  describe(p, detail::linear_path_name(p.n, w_dtype, prec, 0, LinearOrder::fastest, tuning), acc,
                           tp ? tp->size() : 1) +
                      " isa=" + isa_name(isa));
          }
        }
      }
    }
  }
}

// The n == 1 tuning variants of the AVX-512 kernels (interleaved 4- and 8-row tiles with
// prefetch off / far, rows one at a time without prefetch or with a short one; the default,
// rows one at a time with an 8 KiB prefetch, is covered by every other test).
TEST_P(LinearTest, Avx512TuningVariantsMatchF64) {
  if (detected_isa() != Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  auto [w_dtype, prec] = GetParam();
  ThreadPool pool(2);
  for (auto [pf, rows_single] : {std::pair<int64_t, int>{1024, 4}, {4096, 8}, {0, 4}, {0, 8}, {0, 1}, {64, 1}}) {
    detail::LinearTuning tuning;
    tuning.prefetch_bytes = pf;
    tuning.rows_single = rows_single;
    for (const Case& c : kCases) {
      if (c.n != 1) continue;
      Problem p = make_problem(c, w_dtype, prec, 31);
      std::vector<float> y = p.y_init;
      detail::linear_tuned(p.x.data(), p.n, p.x_stride, p.w(), p.w_dtype, p.rows, p.cols, y.data(), p.y_stride, prec,
                           &pool, test_scratch(), false, tuning);
      check(p, y, false, describe(p, "avx512 tuning", false, 2) + " pf=" + std::to_string(pf));
    }
  }
}

// The bf16 x bf16 small-n layouts (2..kSmallNMax tokens: the row streams up to row_seq_max_n
// tokens in 1, 2 or 4 streams with and without prefetch, then 1-row tiles for n <= 4, 3- or
// 4-row tiles with prefetch, and the general tiles when switched off), at every n in the range,
// row counts that leave partial tiles and streams, and column counts off the 32-column step, on
// both sides of the general tiles' 1024-column switch to one-row streams; with the default x
// budget and a 1 KiB one, which splits even these columns into several blocks (partial sums
// added into y), with short and long prefetch distances (prefetches past the end of W are
// harmless hints), and with row chunks off, of one tile, and of a few tiles (partial chunks at
// the end of a thread's rows).
TEST_P(LinearTest, Avx512SmallNLayoutsMatchF64) {
  if (detected_isa() != Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  auto [w_dtype, prec] = GetParam();
  if (w_dtype != DType::bf16 || prec != ActPrecision::bf16) GTEST_SKIP() << "bf16 x bf16 only";
  ThreadPool pool(2);
  struct Layout {
    int layout;
    int64_t x_bytes, pf_min, chunk;
    int row_seq_max_n, row_streams;
    int64_t prefetch_bytes;
  };
  for (Layout l : {Layout{0, 0, 0, 0, 1, 4, 8192},
                   {3, 0, 0, 0, 1, 4, 8192},
                   {4, 0, 0, 0, 1, 4, 8192},
                   {3, 1024, 64, 0, 1, 4, 8192},
                   {4, 1024, 65536, 0, 1, 4, 8192},
                   {3, 1024, 64, -1, 1, 4, 8192},
                   {3, 1024, 64, 4096, 1, 4, 8192},
                   {4, 2048, 0, 20000, 1, 4, 8192},
                   {3, 0, 0, 0, 4, 4, 8192},
                   {3, 0, 0, 0, 4, 2, 64},
                   {0, 0, 0, 0, 4, 1, 0},
                   {4, 1024, 64, 0, 3, 4, 0}}) {
    const auto [layout, x_bytes, pf_min, chunk, row_seq_max_n, row_streams, prefetch_bytes] = l;
    detail::LinearTuning tuning;  // 0: the default; chunk < 0: no row chunks
    tuning.small_n_layout = layout;
    tuning.row_seq_max_n = row_seq_max_n;
    tuning.row_streams = row_streams;
    tuning.prefetch_bytes = prefetch_bytes;
    tuning.row_seq_prefetch_bytes = prefetch_bytes;
    if (x_bytes != 0) tuning.small_n_x_bytes = x_bytes;
    if (pf_min != 0) tuning.small_n_prefetch_min_bytes = pf_min;
    if (chunk != 0) tuning.small_n_chunk_bytes = std::max<int64_t>(chunk, 0);
    for (int64_t n = 2; n <= detail::kSmallNMax + 1; ++n)
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{35, 47}, {70, 300}, {38, 1100}, {9, 64}}) {
        Problem p = make_problem({n, rows, cols}, w_dtype, prec, static_cast<uint32_t>(41 + n));
        for (bool acc : {false, true})
          for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::vector<float> y = p.y_init;
            detail::linear_tuned(p.x.data(), p.n, p.x_stride, p.w(), p.w_dtype, p.rows, p.cols, y.data(), p.y_stride,
                                 prec, tp, test_scratch(), acc, tuning);
            check(p, y, acc,
                  describe(p, "avx512 small-n", acc, tp ? tp->size() : 1) + " layout=" + std::to_string(layout) +
                      " x_bytes=" + std::to_string(x_bytes) + " chunk=" + std::to_string(chunk) + " row_seq_max_n=" +
                      std::to_string(row_seq_max_n) + " row_streams=" + std::to_string(row_streams));
          }
      }
  }
}

// The many-token "pairs" kernel (bf16 x bf16, AVX-512 BF16, even cols) forced for every n
// (token counts that are not multiples of its 16-token blocks or 64-token tiles, row counts
// that are not multiples of its 6-row tiles), and switched off (the tiles for every n).
TEST_P(LinearTest, Avx512PairsForcedOnAndOffMatchF64) {
  if (detected_isa() != Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  auto [w_dtype, prec] = GetParam();
  ThreadPool pool(2);
  const std::vector<Case> extra = {{17, 6, 2}, {33, 13, 64}, {64, 96, 1024}, {80, 7, 384}, {129, 22, 98}};
  for (int64_t min_n : {int64_t{1}, int64_t{1} << 40}) {
    detail::LinearTuning tuning;
    tuning.pairs_min_n = min_n;
    for (const std::vector<Case>* cases : {&kCases, &extra}) {
      for (const Case& c : *cases) {
        Problem p = make_problem(c, w_dtype, prec, 37);
        for (bool acc : {false, true}) {
          std::vector<float> y = p.y_init;
          detail::linear_tuned(p.x.data(), p.n, p.x_stride, p.w(), p.w_dtype, p.rows, p.cols, y.data(), p.y_stride,
                               prec, &pool, test_scratch(), acc, tuning);
          check(p, y, acc,
                describe(p, detail::linear_path_name(p.n, w_dtype, prec, p.cols, LinearOrder::fastest, tuning), acc,
                         2));
        }
      }
    }
  }
}

// Every output element of afd's own kernels is computed the same way however the rows are
// split over threads, so the result is bit for bit that of the calling thread alone for any
// pool size (the engine's FFN runs whole experts per thread). The library sgemm path is not
// covered: its numbers depend on the block of rows it is handed.
TEST_P(LinearTest, ResultsDoNotDependOnThePoolSize) {
  auto [w_dtype, prec] = GetParam();
  ThreadPool p2(2), p3(3), p4(4);
  for (int64_t n : {1, 2, 3, 5, 8, 13, 17, 31, 40, 48, 49, 64, 100})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{35, 64}, {70, 300}, {257, 1100}}) {
      if (std::string(linear_path_name(n, w_dtype, prec, cols)) == "openblas_sgemm") continue;
      Problem p = make_problem({n, rows, cols}, w_dtype, prec, static_cast<uint32_t>(53 + n));
      std::vector<float> want = p.y_init;
      linear(p.x.data(), p.n, p.x_stride, p.w(), p.w_dtype, p.rows, p.cols, want.data(), p.y_stride, prec, nullptr,
             test_scratch());
      for (ThreadPool* pool : {&p2, &p3, &p4}) {
        std::vector<float> y = p.y_init;
        linear(p.x.data(), p.n, p.x_stride, p.w(), p.w_dtype, p.rows, p.cols, y.data(), p.y_stride, prec, pool,
               test_scratch());
        EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0)
            << describe(p, linear_path_name(p.n, w_dtype, prec, p.cols), false, pool->size());
      }
    }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, LinearTest,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f32),
                                            ::testing::Values(ActPrecision::f32, ActPrecision::bf16)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_act_" +
                                  (std::get<1>(info.param) == ActPrecision::bf16 ? "bf16" : "f32");
                         });

// The path names that benchmarks report follow the ISA level.
TEST(LinearDispatch, PathFollowsIsa) {
  {
    IsaLimitGuard g(Isa::scalar);
    EXPECT_STREQ(linear_path_name(1, DType::bf16, ActPrecision::f32), "scalar");
    EXPECT_STREQ(linear_impl_name(ActPrecision::bf16), "scalar");
  }
  if (detected_isa() >= Isa::avx2) {
    IsaLimitGuard g(Isa::avx2);
    EXPECT_STREQ(linear_path_name(1, DType::bf16, ActPrecision::bf16), "avx2_fma_tile");
  }
  if (detected_isa() == Isa::avx512) {
    EXPECT_STREQ(linear_path_name(1, DType::bf16, ActPrecision::bf16), "avx512_bf16_dp_tile");
    EXPECT_STREQ(linear_path_name(1, DType::bf16, ActPrecision::f32), "avx512_fma_tile");
    // Many tokens: the pairs kernel for even cols, the tiles for odd cols and f32 activations.
    EXPECT_STREQ(linear_path_name(512, DType::bf16, ActPrecision::bf16, 1024), "avx512_bf16_dp_pairs");
    EXPECT_STREQ(linear_path_name(512, DType::bf16, ActPrecision::bf16, 1023), "avx512_bf16_dp_tile");
    EXPECT_STREQ(linear_path_name(512, DType::bf16, ActPrecision::f32, 1024), "avx512_fma_tile");
  }
}

}  // namespace
}  // namespace afd::kernels::test_linear
