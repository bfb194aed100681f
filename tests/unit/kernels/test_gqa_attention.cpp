// gqa_decode_attend on every ISA level (each of its paths: the tiled AVX-512 kernel, the
// multi-query kernel, the loop nest) against the scalar reference, over paged rows in f32, bf16
// and fp8 (shuffled blocks, partial last blocks, head_dim on and off the 16-value tiles, group
// sizes past the 8 heads kept in registers, sliding windows that start inside a block).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/gqa_attention.h"
#include "test_util.h"

namespace afd::kernels {
namespace {

struct Case {
  int64_t heads, head_dim, n_ctx, j0, block_size;
  DType dt;
};

void check(const Case& c) {
  const int64_t hd = c.head_dim;
  auto q = testing::random_vec(static_cast<size_t>(c.heads * hd), 21);
  testing::Paged k = testing::make_paged(testing::random_vec(static_cast<size_t>(c.n_ctx * hd), 22), c.n_ctx, hd,
                                         c.block_size, c.dt);
  testing::Paged v = testing::make_paged(testing::random_vec(static_cast<size_t>(c.n_ctx * hd), 23), c.n_ctx, hd,
                                         c.block_size, c.dt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> want(q.size()), got;
  ScratchSlot scratch;
  ref::gqa_decode_attend(q.data(), c.heads, k.view, v.view, c.j0, c.n_ctx, scale, want.data());
  for (Isa isa : testing::isa_levels()) {
    testing::IsaLimitGuard g(isa);
    got.assign(want.size(), -7.0f);
    gqa_decode_attend(q.data(), c.heads, k.view, v.view, c.j0, c.n_ctx, scale, got.data(), scratch);
    // Every path computes in f32 and differs from the reference in the summation order only.
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-5f) << isa_name(isa) << " path " << gqa_decode_path_name(hd, c.j0) << " "
                                          << dtype_name(c.dt) << " hd " << hd << " heads " << c.heads << " ctx "
                                          << c.n_ctx << " j0 " << c.j0 << " i " << i;
  }
}

TEST(GqaDecode, EveryPathMatchesTheReference) {
  for (DType dt : {DType::f32, DType::bf16, DType::f8_e4m3})
    for (int64_t hd : {16, 24, 128})
      for (int64_t heads : {1, 3, 8, 12})
        for (auto [n_ctx, j0] : {std::pair<int64_t, int64_t>{1, 0}, {37, 0}, {300, 0}, {300, 211}, {40, 3}})
          check({heads, hd, n_ctx, j0, 16, dt});
}

TEST(GqaDecode, BlocksNotAMultipleOfTheTile) {
  for (DType dt : {DType::f32, DType::bf16, DType::f8_e4m3}) check({4, 32, 61, 0, 5, dt});
}

}  // namespace
}  // namespace afd::kernels
