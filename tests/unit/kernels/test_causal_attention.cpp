// causal_attention: the reference's first token and the dispatch rule. The kernel against the
// reference at every ISA level, in both orders, is the registry's (test_kernel_ops: "causal_attention
// fast" / "causal_attention decode").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/causal_attention.h"
#include "test_util.h"

namespace afd::kernels::test_causal_attention {
namespace {

using testing::IsaLimitGuard;
using testing::isa_levels;
using testing::random_vec;

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
}  // namespace afd::kernels::test_causal_attention
