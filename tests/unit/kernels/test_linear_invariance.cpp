// Batch invariance of linear() with bf16 activations and LinearOrder::batch_invariant (ops.h):
// every token's output row is bit for bit the row that the same token gives alone (n = 1, no
// pool, default tuning), whatever the number of tokens, the token's index among them, the other
// tokens, the pool size, the kernel path, the tuning knobs and accumulate. Covered: bf16 weights
// on AVX-512 BF16 (the canonical order of kernels/cpu/linear_kernels.h: row streams of 1 to
// kRowSeqMaxN tokens, small-n tiles with and without column blocks, general tiles, the pairs
// kernel) and the scalar path.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace afd::kernels::test_linear_invariance {
namespace {

using testing::IsaLimitGuard;
using testing::random_vec;
using testing::test_scratch;

constexpr int64_t kTokens = 257;  // distinct tokens of a problem; a call takes n of them
const int64_t kNs[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 65, 100, 257};

// kTokens tokens x [kTokens, x_stride], W bf16 [rows, cols], y's initial contents y0
// [kTokens, y_stride], and alone [2][kTokens, rows]: each token's row computed alone (at the
// active ISA level), without and with accumulate.
struct Problem {
  int64_t rows, cols, x_stride, y_stride;
  std::vector<float> x, y0;
  std::vector<uint16_t> w;
  std::vector<float> alone[2];
};

Problem make_problem(int64_t rows, int64_t cols, uint32_t seed) {
  Problem p{rows, cols, cols + 3, rows + 5, {}, {}, {}, {}};
  p.x = random_vec(static_cast<size_t>(kTokens * p.x_stride), seed);
  p.y0 = random_vec(static_cast<size_t>(kTokens * p.y_stride), seed + 1);
  const std::vector<float> w = random_vec(static_cast<size_t>(rows * cols), seed + 2);
  for (float v : w) p.w.push_back(f32_to_bf16(v).bits);
  for (int acc = 0; acc < 2; ++acc) {
    p.alone[acc].resize(static_cast<size_t>(kTokens * rows));
    for (int64_t i = 0; i < kTokens; ++i) {
      std::vector<float> y(p.y0.begin() + i * p.y_stride, p.y0.begin() + i * p.y_stride + rows);
      linear(p.x.data() + i * p.x_stride, 1, p.x_stride, p.w.data(), DType::bf16, rows, cols, y.data(), p.y_stride,
             ActPrecision::bf16, nullptr, test_scratch(), acc == 1, LinearOrder::batch_invariant);
      std::copy(y.begin(), y.end(), p.alone[acc].begin() + i * rows);
    }
  }
  return p;
}

// One call on n tokens (token j of the call is problem token (first + j * step) % kTokens);
// every row compared bitwise with the token's row alone. Returns the number of differing rows.
int64_t run_and_compare(const Problem& p, int64_t n, int64_t first, int64_t step, ThreadPool* pool, bool acc,
                        const detail::LinearTuning& tuning, const std::string& what) {
  std::vector<float> x(static_cast<size_t>(n * p.x_stride)), y(static_cast<size_t>(n * p.y_stride));
  std::vector<int64_t> tok(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    tok[j] = (first + j * step) % kTokens;
    std::copy_n(p.x.begin() + tok[j] * p.x_stride, p.x_stride, x.begin() + j * p.x_stride);
    std::copy_n(p.y0.begin() + tok[j] * p.y_stride, p.y_stride, y.begin() + j * p.y_stride);
  }
  detail::linear_tuned(x.data(), n, p.x_stride, p.w.data(), DType::bf16, p.rows, p.cols, y.data(), p.y_stride,
                       ActPrecision::bf16, pool, test_scratch(), acc, tuning, LinearOrder::batch_invariant);
  int64_t bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float* want = p.alone[acc].data() + tok[j] * p.rows;
    if (std::memcmp(y.data() + j * p.y_stride, want, static_cast<size_t>(p.rows) * sizeof(float)) != 0 && bad++ == 0) {
      int64_t r = 0;
      while (std::memcmp(&y[j * p.y_stride + r], &want[r], sizeof(float)) == 0) ++r;
      ADD_FAILURE() << what << " n=" << n << " rows=" << p.rows << " cols=" << p.cols << (acc ? " accumulate" : "")
                    << " threads=" << (pool ? pool->size() : 1) << " path="
                    << detail::linear_path_name(n, DType::bf16, ActPrecision::bf16, p.cols, LinearOrder::batch_invariant,
                                                tuning)
                    << " isa=" << isa_name(active_isa()) << ": token " << j << " row " << r << " got "
                    << y[j * p.y_stride + r] << " alone " << want[r];
    }
  }
  return bad;
}

// Column counts: tiny, around and off the 32-column chunk and the 128-column step of the row
// streams, odd (no pairs kernel), the bench model's rows.
const int64_t kCols[] = {2, 31, 32, 47, 64, 100, 128, 257, 300, 768, 1100, 2048};

// Default tuning; the pairs kernel from its default threshold, for every n and never; pools
// of 1, 2, 3 threads and none.
TEST(LinearBatchInvariance, Bf16Avx512EveryPathNAndPool) {
  if (detected_isa() != Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  ThreadPool p1(1), p2(2), p3(3);
  for (int64_t cols : kCols) {
    const Problem p = make_problem(37, cols, static_cast<uint32_t>(cols));
    for (int64_t pairs_min_n : {int64_t{-1}, int64_t{1}, int64_t{1} << 40}) {
      detail::LinearTuning tuning;
      tuning.pairs_min_n = pairs_min_n;
      int64_t bad = 0;
      for (int64_t n : kNs)
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p1, &p2, &p3})
          for (bool acc : {false, true})
            bad += run_and_compare(p, n, n * 7, 1 + 2 * (n % 5), pool, acc, tuning,
                                   "pairs_min_n=" + std::to_string(pairs_min_n));
      EXPECT_EQ(bad, 0) << "cols=" << cols << " pairs_min_n=" << pairs_min_n;
    }
  }
}

// Every tuning knob of the AVX-512 kernels gives the default's bits: rows one at a time (1 to
// kRowSeqMaxN tokens, or one token only) in 1, 2 or 4 streams and n = 1 4- / 8-row tiles with
// any prefetch distance; the small-n layouts (general tiles, 3- and 4-row tiles, with and
// without the row streams below them) with x budgets small enough to split the columns into
// blocks, any prefetch distance and row chunks off, of one tile and of a few tiles.
TEST(LinearBatchInvariance, Bf16Avx512EveryTuning) {
  if (detected_isa() != Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  struct Knobs {
    int rows_single, row_streams;
    int64_t prefetch_bytes;
    int small_n_layout;
    int64_t x_bytes, pf_min, chunk;  // 0: the default; chunk < 0: no row chunks
    int row_seq_max_n;               // 0: the default
    int64_t row_seq_prefetch_bytes = 0;
  };
  const Knobs knobs[] = {
      {4, 1, 1024, 3, 0, 0, 0, 1},        {8, 1, 4096, 3, 0, 0, 0, 1},       {4, 1, 0, 3, 0, 0, 0, 1},
      {8, 1, 0, 3, 0, 0, 0, 1},           {1, 1, 0, 3, 0, 0, 0, 1},          {1, 1, 64, 3, 0, 0, 0, 1},
      {1, 2, 8192, 3, 0, 0, 0, 1},        {1, 4, 8192, 3, 0, 0, 0, 1},       {1, 4, 0, 3, 0, 0, 0, 1},
      {1, 1, 8192, 0, 0, 0, 0, 1},        {1, 1, 8192, 4, 0, 0, 0, 1},       {1, 1, 8192, 3, 1024, 64, 0, 1},
      {1, 1, 8192, 4, 1024, 65536, 0, 1}, {1, 1, 8192, 3, 1024, 64, -1, 1},  {1, 1, 8192, 3, 1024, 64, 4096, 1},
      {1, 1, 8192, 4, 2048, 0, 20000, 1}, {1, 1, 8192, 3, 8192, 0, -1, 1},   {1, 1, 8192, 0, 1024, 0, 0, 1},
      {1, 1, 0, 3, 0, 0, 0, 4, 64},       {1, 2, 64, 3, 0, 0, 0, 4, 8192},   {1, 4, 8192, 3, 0, 0, 0, 4, 8192},
      {1, 4, 0, 0, 0, 0, 0, 4, 0},        {4, 4, 8192, 3, 0, 0, 0, 4, 1024}, {8, 2, 4096, 4, 1024, 64, 0, 3, 0},
      {1, 4, 8192, 3, 0, 0, 0, 2, 4096},  {1, 2, 8192, 4, 0, 0, 0, 3, 0}};
  ThreadPool pool(2);
  for (int64_t cols : {int64_t{47}, int64_t{100}, int64_t{300}, int64_t{1100}, int64_t{2048}}) {
    const Problem p = make_problem(70, cols, static_cast<uint32_t>(100 + cols));
    for (const Knobs& k : knobs) {
      detail::LinearTuning tuning;
      tuning.rows_single = k.rows_single;
      tuning.row_streams = k.row_streams;
      tuning.prefetch_bytes = k.prefetch_bytes;
      tuning.small_n_layout = k.small_n_layout;
      if (k.x_bytes != 0) tuning.small_n_x_bytes = k.x_bytes;
      if (k.pf_min != 0) tuning.small_n_prefetch_min_bytes = k.pf_min;
      if (k.chunk != 0) tuning.small_n_chunk_bytes = std::max<int64_t>(k.chunk, 0);
      if (k.row_seq_max_n != 0) tuning.row_seq_max_n = k.row_seq_max_n;
      tuning.row_seq_prefetch_bytes = k.row_seq_prefetch_bytes;
      const std::string what = "rows_single=" + std::to_string(k.rows_single) +
                               " row_seq_max_n=" + std::to_string(k.row_seq_max_n) +
                               " row_seq_prefetch=" + std::to_string(k.row_seq_prefetch_bytes) +
                               " row_streams=" + std::to_string(k.row_streams) +
                               " prefetch=" + std::to_string(k.prefetch_bytes) +
                               " layout=" + std::to_string(k.small_n_layout) + " x_bytes=" + std::to_string(k.x_bytes) +
                               " pf_min=" + std::to_string(k.pf_min) + " chunk=" + std::to_string(k.chunk);
      int64_t bad = 0;
      for (int64_t n : kNs)
        for (bool acc : {false, true}) bad += run_and_compare(p, n, 3 * n, 1, &pool, acc, tuning, what);
      EXPECT_EQ(bad, 0) << "cols=" << cols << " " << what;
    }
  }
}

// The scalar path (one sequential sum per element), on every CPU; no OpenBLAS at large n.
TEST(LinearBatchInvariance, Bf16ScalarEveryNAndPool) {
  IsaLimitGuard isa(Isa::scalar);
  ThreadPool p3(3);
  for (int64_t cols : {int64_t{31}, int64_t{300}}) {
    const Problem p = make_problem(37, cols, static_cast<uint32_t>(200 + cols));
    int64_t bad = 0;
    for (int64_t n : kNs)
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p3})
        for (bool acc : {false, true}) bad += run_and_compare(p, n, 5 * n, 3, pool, acc, {}, "scalar");
    EXPECT_EQ(bad, 0) << "cols=" << cols;
  }
}

}  // namespace
}  // namespace afd::kernels::test_linear_invariance
