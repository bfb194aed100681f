// Batch invariance of linear() with f32 activations (the router, the shared-expert gate and
// reference precision) under LinearOrder::batch_invariant (ops.h): every token's row is bit for
// bit the row the token gives alone, whatever n, its index, the pool and accumulate, for bf16 and
// f32 weights, at every ISA level the CPU has. The fastest order is not invariant there (n = 1
// takes 4 chains per row): the test checks that too, so it can fail.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace afd::kernels {
namespace {

using testing::IsaLimitGuard;
using testing::random_vec;
using testing::test_scratch;

// Rows of `n` tokens (one call) that differ bitwise from the tokens' rows alone.
int64_t differing_rows(DType wt, int64_t rows, int64_t cols, int64_t n, ThreadPool* pool, bool acc,
                       LinearOrder order) {
  const std::vector<float> x = random_vec(static_cast<size_t>(n * cols), 3);
  const std::vector<float> y0 = random_vec(static_cast<size_t>(n * rows), 4);
  const std::vector<float> wf = random_vec(static_cast<size_t>(rows * cols), 5);
  std::vector<uint16_t> wb;
  for (float v : wf) wb.push_back(f32_to_bf16(v).bits);
  const void* w = wt == DType::bf16 ? static_cast<const void*>(wb.data()) : static_cast<const void*>(wf.data());
  std::vector<float> all = y0;
  linear(x.data(), n, cols, w, wt, rows, cols, all.data(), rows, ActPrecision::f32, pool, test_scratch(), acc, order);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> one(y0.begin() + i * rows, y0.begin() + (i + 1) * rows);
    linear(x.data() + i * cols, 1, cols, w, wt, rows, cols, one.data(), rows, ActPrecision::f32, nullptr,
           test_scratch(), acc, order);
    if (std::memcmp(one.data(), all.data() + i * rows, static_cast<size_t>(rows) * sizeof(float)) != 0) ++bad;
  }
  return bad;
}

TEST(LinearF32Invariance, EveryRowEqualsTheTokenAlone) {
  ThreadPool p2(2), p3(3);
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::scalar}) {
    if (static_cast<int>(isa) > static_cast<int>(active_isa())) continue;
    IsaLimitGuard g(isa);
    for (DType wt : {DType::bf16, DType::f32})
      for (int64_t cols : {16, 40, 64, 200, 1024})
        for (int64_t n : {1, 2, 3, 5, 8, 17, 64, 100})
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p2, &p3})
            for (bool acc : {false, true})
              EXPECT_EQ(differing_rows(wt, 37, cols, n, pool, acc, LinearOrder::batch_invariant), 0)
                  << isa_name(isa) << " " << dtype_name(wt) << " cols " << cols << " n " << n << " pool "
                  << (pool ? pool->size() : 0) << " acc " << acc;
  }
}

TEST(LinearF32Invariance, TheFastestOrderDependsOnN) {
  if (active_isa() != Isa::avx512) GTEST_SKIP() << "the 4-chain single-token rows are AVX-512's";
  int64_t bad = 0;
  for (int64_t n : {2, 5, 17}) bad += differing_rows(DType::bf16, 37, 1024, n, nullptr, false, LinearOrder::fastest);
  EXPECT_GT(bad, 0);
}

}  // namespace
}  // namespace afd::kernels
