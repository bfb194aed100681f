// mla_decode_attend / mqa_decode_attend (separate value rows): the scalar reference against f64,
// and the split-K segments combined against one call, on every ISA level, over paged rows in
// f32, bf16 and fp8 (block tables with shuffled blocks, partial last blocks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/mla_attention.h"
#include "test_util.h"

namespace afd::kernels::test_mla_attention {
namespace {

using testing::isa_levels;
using testing::IsaLimitGuard;
using testing::Paged;
using testing::random_vec;
using testing::test_scratch;

struct Case {
  int64_t heads, d_lat, d_rope, n_ctx, block_size;
  DType dt;
  bool sep_v = false;  // separate value rows of d_lat values (MFA) instead of the key's first d_lat
};

Paged make_paged(const Case& c, const std::vector<float>& rows, int64_t D) {
  return testing::make_paged(rows, c.n_ctx, D, c.block_size, c.dt);
}

void check(const Case& c) {
  const int64_t D = c.d_lat + c.d_rope;
  // q rows with a stride wider than D, out rows with a stride wider than d_lat.
  const int64_t qs = D + 3, os = c.d_lat + 5;
  auto q = random_vec(static_cast<size_t>(c.heads * qs), 11, -1.0f, 1.0f);
  auto rows = random_vec(static_cast<size_t>(c.n_ctx * D), 12, -1.0f, 1.0f);
  Paged p = make_paged(c, rows, D);
  // Value rows: the keys' first d_lat values, or (sep_v) rows of their own.
  std::vector<float> vrows(static_cast<size_t>(c.n_ctx * c.d_lat));
  if (c.sep_v) {
    vrows = random_vec(vrows.size(), 13, -1.0f, 1.0f);
  } else {
    for (int64_t j = 0; j < c.n_ctx; ++j) std::copy_n(&rows[j * D], c.d_lat, &vrows[j * c.d_lat]);
  }
  Paged pv = make_paged(c, vrows, c.d_lat);
  const PagedRows* v = c.sep_v ? &pv.view : nullptr;
  const float scale = 0.19f;
  std::vector<float> want(static_cast<size_t>(c.heads * os), -7.0f);
  ref::mqa_decode_attend(q.data(), qs, c.heads, p.view, v, c.d_lat, c.n_ctx, scale, want.data(), os);
  // A direct f64 evaluation of the contract.
  for (int64_t h = 0; h < c.heads; ++h) {
    std::vector<double> s(static_cast<size_t>(c.n_ctx));
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < c.n_ctx; ++j) {
      double a = 0;
      for (int64_t i = 0; i < D; ++i) a += static_cast<double>(q[h * qs + i]) * rows[j * D + i];
      s[j] = a * scale;
      mx = std::max(mx, s[j]);
    }
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int64_t i = 0; i < c.d_lat; ++i) {
      double o = 0;
      for (int64_t j = 0; j < c.n_ctx; ++j) o += s[j] / sum * vrows[j * c.d_lat + i];
      ASSERT_NEAR(want[h * os + i], o, 1e-5) << "reference h " << h << " i " << i;
    }
  }
}

// The scalar reference against a direct f64 evaluation of the contract (f32 rows), on the
// registry's shapes; the kernels against the reference at every ISA level and KV dtype are the
// registry's (test_kernel_ops: "mla_decode", "mqa_decode sep_v (MFA)").
TEST(MlaDecode, ReferenceMatchesF64) {
  const DType dt = DType::f32;
  check({4, 128, 32, 1, 16, dt});    // dsv3-tiny dims, one position
  check({4, 128, 32, 37, 16, dt});   // partial last block
  check({33, 64, 16, 70, 8, dt});    // heads past one 32-head tile
  check({16, 512, 64, 45, 16, dt});  // DeepSeek-V3 row width
  check({8, 128, 32, 300, 16, dt});  // several online-softmax chunks, the last one partial
  check({4, 512, 64, 1000, 16, dt});
  check({16, 128, 32, 2 * kMqaSegment + 77, 16, dt});  // three split-K segments, the last partial
  check({8, 64, 0, kMqaSegment + 1, 16, dt, true});    // a one-position last segment
  check({64, 256, 0, 300, 16, dt, true});              // MFA: K and V rows of 256, 64 heads
  check({5, 64, 32, 33, 8, dt, true});                 // keys wider than the values
}

// The segments run as separate calls (as the engine spreads them over threads) and combined give
// the same bits as one mqa_decode_attend call, on every ISA level and dtype.
TEST(MlaDecode, SegmentsCombineToTheSameBits) {
  for (DType dt : {DType::f32, DType::bf16, DType::f8_e4m3}) {
    const Case c{24, 256, 64, 3 * kMqaSegment - 5, 16, dt};
    const int64_t D = c.d_lat + c.d_rope, qs = D, os = c.d_lat;
    auto q = random_vec(static_cast<size_t>(c.heads * qs), 21, -1.0f, 1.0f);
    auto rows = random_vec(static_cast<size_t>(c.n_ctx * D), 22, -1.0f, 1.0f);
    Paged p = make_paged(c, rows, D);
    const int64_t ns = mqa_decode_segments(c.n_ctx);
    ASSERT_EQ(ns, 3);
    for (Isa isa : isa_levels()) {
      IsaLimitGuard g(isa);
      std::vector<float> whole(static_cast<size_t>(c.heads * os)), split(whole.size());
      mqa_decode_attend(q.data(), qs, c.heads, p.view, nullptr, c.d_lat, c.n_ctx, 0.07f, whole.data(), os,
                        test_scratch().slot(0));
      std::vector<float> o(static_cast<size_t>(ns * c.heads * os)), ml(static_cast<size_t>(2 * ns * c.heads));
      std::vector<MqaPartial> parts(static_cast<size_t>(ns));
      for (int64_t s = ns - 1; s >= 0; --s) {  // any order of the segment calls
        parts[s] = MqaPartial{&o[s * c.heads * os], os, &ml[2 * s * c.heads], &ml[(2 * s + 1) * c.heads]};
        mqa_decode_segment(q.data(), qs, c.heads, p.view, nullptr, c.d_lat, c.n_ctx, s, 0.07f, parts[s],
                           test_scratch().slot(0));
      }
      mqa_decode_combine(c.heads, c.d_lat, parts.data(), ns, split.data(), os, test_scratch().slot(0));
      for (size_t i = 0; i < whole.size(); ++i)
        ASSERT_EQ(f32_bits(whole[i]), f32_bits(split[i])) << isa_name(isa) << " " << dtype_name(dt) << " " << i;
    }
  }
}

}  // namespace
}  // namespace afd::kernels::test_mla_attention
