// causal_attention on every ISA level, in both orders (CausalOrder), against the scalar
// reference: head dims that fill the P.V tiles fully or not (16 .. 128), GQA group sizes 1 .. 8,
// runs that start at position 0 or after earlier context, sliding windows, padded row strides,
// with and without a pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/causal_attention.h"
#include "test_util.h"

namespace afd::kernels {
namespace {

using testing::IsaLimitGuard;
using testing::isa_levels;
using testing::random_vec;
using testing::test_scratch;

struct Case {
  int64_t heads, kv_heads, hd, nq, p0, window;
};

void check(const Case& c, ThreadPool* pool, uint32_t seed) {
  const int64_t q_stride = c.heads * c.hd + 3, kv_stride = c.kv_heads * c.hd + 5, out_stride = c.heads * c.hd + 7;
  const int64_t n_ctx = c.p0 + c.nq;
  const auto q = random_vec(static_cast<size_t>(c.nq * q_stride), seed, -2.0f, 2.0f);
  const auto k = random_vec(static_cast<size_t>(n_ctx * kv_stride), seed + 1, -2.0f, 2.0f);
  const auto v = random_vec(static_cast<size_t>(n_ctx * kv_stride), seed + 2);
  const CausalAttnShape s{c.heads, c.kv_heads, c.hd, c.window};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  std::vector<float> want(static_cast<size_t>(c.nq * out_stride), -7.0f);
  ref::causal_attention(q.data(), q_stride, c.nq, c.p0, k.data(), v.data(), kv_stride, s, scale, want.data(),
                        out_stride);
  for (int level = 0; level < 2 * static_cast<int>(isa_levels().size()); ++level) {
    const Isa isa = isa_levels()[level / 2];
    const CausalOrder order = level % 2 == 0 ? CausalOrder::fast : CausalOrder::decode;
    IsaLimitGuard guard(isa);
    std::vector<float> got(want.size(), -7.0f);
    causal_attention(q.data(), q_stride, c.nq, c.p0, k.data(), v.data(), kv_stride, s, scale, got.data(), out_stride,
                     pool, test_scratch(), order);
    for (int64_t i = 0; i < c.nq; ++i) {
      for (int64_t e = 0; e < out_stride; ++e) {
        const size_t at = static_cast<size_t>(i * out_stride + e);
        if (e >= c.heads * c.hd) {
          ASSERT_EQ(got[at], -7.0f) << "padding written, row " << i << " isa " << isa_name(isa);
          continue;
        }
        ASSERT_NEAR(got[at], want[at], 2e-5f * (1.0f + std::fabs(want[at])))
            << "token " << i << " element " << e << " isa " << isa_name(isa) << " order " << level % 2 << " heads "
            << c.heads << "/" << c.kv_heads << " hd " << c.hd << " nq " << c.nq << " p0 " << c.p0 << " window "
            << c.window;
      }
    }
  }
}

const Case kCases[] = {
    {16, 4, 64, 100, 0, 0},   // small-model shape, prefill from position 0
    {32, 4, 128, 37, 50, 0},  // bench-model shape, a chunk after earlier context
    {8, 8, 16, 70, 3, 0},     // G = 1, one 16-value chunk
    {6, 2, 80, 33, 10, 0},    // head_dim 80: P.V tiles of one chunk
    {12, 4, 96, 21, 0, 0},    // head_dim 96: tiles of two chunks, G = 3 (tiles straddle tokens)
    {4, 1, 32, 129, 0, 20},   // sliding window shorter than the run
    {8, 2, 64, 90, 70, 64},   // window with earlier context, window == one score block
    {12, 3, 48, 1, 0, 0},     // one token at position 0
    {16, 4, 64, 5, 200, 0},   // a short run after a long context
    {4, 2, 24, 9, 2, 0},      // head_dim not a multiple of 16: the reference on every level
};

TEST(CausalAttention, MatchesReferenceWithPool) {
  ThreadPool pool(2);
  uint32_t seed = 11;
  for (const Case& c : kCases) check(c, &pool, seed += 7);
}

TEST(CausalAttention, MatchesReferenceWithoutPool) {
  uint32_t seed = 5;
  for (const Case& c : kCases) check(c, nullptr, seed += 3);
}

TEST(CausalAttention, ReferenceFirstTokenIsItsValueRow) {
  // The first position attends only to itself: out = v[0] for every head of the group.
  const CausalAttnShape s{4, 2, 16, 0};
  const auto q = random_vec(64, 1), k = random_vec(32, 2), v = random_vec(32, 3);
  std::vector<float> out(64);
  ref::causal_attention(q.data(), 64, 1, 0, k.data(), v.data(), 32, s, 0.25f, out.data(), 64);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t d = 0; d < 16; ++d) EXPECT_FLOAT_EQ(out[h * 16 + d], v[(h / 2) * 16 + d]);
}

TEST(CausalAttention, BlockedOnlyForAvx512AndHeadDimMultipleOf16) {
  for (Isa isa : isa_levels()) {
    IsaLimitGuard guard(isa);
    EXPECT_EQ(causal_attention_blocked(64), isa == Isa::avx512);
    EXPECT_FALSE(causal_attention_blocked(24));
  }
}

}  // namespace
}  // namespace afd::kernels
