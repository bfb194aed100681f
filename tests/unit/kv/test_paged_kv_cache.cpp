#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kv/paged_kv_cache.h"

namespace afd {
namespace {

KvCacheConfig small_cfg(DType dt) {
  KvCacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = 4;
  c.n_blocks = 6;
  c.dtype = dt;
  return c;
}

TEST(PagedKvCache, BlocksFollowLengthAndAreFreed) {
  auto kv = PagedKvCache::create(small_cfg(DType::f32));
  ASSERT_TRUE(kv.ok());
  auto& c = **kv;
  ASSERT_TRUE(c.add_sequence(7).is_ok());
  EXPECT_FALSE(c.add_sequence(7).is_ok());
  EXPECT_EQ(c.blocks_needed(7, 5), 2);
  ASSERT_TRUE(c.append(7, 5).is_ok());
  EXPECT_EQ(c.length(7), 5);
  EXPECT_EQ(c.n_used_blocks(), 2);
  EXPECT_EQ(c.blocks_needed(7, 3), 0);  // fits in the second block
  ASSERT_TRUE(c.append(7, 3).is_ok());
  EXPECT_EQ(c.n_used_blocks(), 2);
  // Exhaustion leaves state unchanged.
  Status s = c.append(7, 100);
  EXPECT_EQ(s.code(), StatusCode::resource_exhausted);
  EXPECT_EQ(c.length(7), 8);
  c.truncate(7, 3);
  EXPECT_EQ(c.n_used_blocks(), 1);
  c.remove_sequence(7);
  EXPECT_EQ(c.n_used_blocks(), 0);
  EXPECT_EQ(c.length(7), -1);
}

void check_round_trip(DType dt, float tol_rel) {
  auto kv = PagedKvCache::create(small_cfg(dt));
  ASSERT_TRUE(kv.ok());
  auto& c = **kv;
  ASSERT_TRUE(c.add_sequence(1).is_ok());
  ASSERT_TRUE(c.add_sequence(2).is_ok());
  ASSERT_TRUE(c.append(1, 6).is_ok());
  ASSERT_TRUE(c.append(2, 6).is_ok());
  std::vector<float> k(16), v(16), out(16);
  for (int64_t seq : {1, 2})
    for (int64_t pos = 0; pos < 6; ++pos)
      for (int64_t l = 0; l < 2; ++l) {
        for (int i = 0; i < 16; ++i) {
          k[i] = std::sin(0.3f * i + pos + 10 * seq + 100 * l) * (1 + i);
          v[i] = -k[i] * 0.5f;
        }
        c.write(l, seq, pos, k.data(), v.data());
      }
  for (int64_t seq : {1, 2})
    for (int64_t pos = 0; pos < 6; ++pos)
      for (int64_t l = 0; l < 2; ++l) {
        for (int i = 0; i < 16; ++i) k[i] = std::sin(0.3f * i + pos + 10 * seq + 100 * l) * (1 + i);
        c.read_k(l, seq, pos, out.data());
        for (int i = 0; i < 16; ++i) {
          float amax = 0;
          for (int j = (i / 8) * 8; j < (i / 8) * 8 + 8; ++j) amax = std::max(amax, std::fabs(k[j]));
          EXPECT_NEAR(out[i], k[i], tol_rel * amax) << "seq " << seq << " pos " << pos << " i " << i;
        }
        c.read_v(l, seq, pos, out.data());
        for (int i = 0; i < 16; ++i) {
          float amax = 0;
          for (int j = (i / 8) * 8; j < (i / 8) * 8 + 8; ++j) amax = std::max(amax, std::fabs(k[j]));
          EXPECT_NEAR(out[i], -0.5f * k[i], tol_rel * amax) << "v seq " << seq << " pos " << pos;
        }
      }
}

TEST(PagedKvCache, RoundTripF32) { check_round_trip(DType::f32, 0.0f); }
TEST(PagedKvCache, RoundTripBf16) { check_round_trip(DType::bf16, 1.0f / 128); }
// e4m3 has 3 mantissa bits: relative step 1/8 near the top of each binade, scaled per head.
TEST(PagedKvCache, RoundTripFp8) { check_round_trip(DType::f8_e4m3, 1.0f / 16); }

TEST(PagedKvCache, RejectsBadConfig) {
  auto c = small_cfg(DType::i32);
  EXPECT_FALSE(PagedKvCache::create(c).ok());
  c = small_cfg(DType::bf16);
  c.n_blocks = 0;
  EXPECT_FALSE(PagedKvCache::create(c).ok());
}

}  // namespace
}  // namespace afd
