#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
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

// The stored rounding is exactly core/dtype.h's, element by element (the store goes through
// the vector kernels where the CPU has them): bf16 round to nearest even; fp8 with the head
// row's scale amax / 448 and x * (1 / scale) rounded; head_dim 8 and 40 (a masked tail).
void check_exact_store(DType dt, int64_t hd) {
  KvCacheConfig cfg = small_cfg(dt);
  cfg.head_dim = hd;
  auto kv = PagedKvCache::create(cfg);
  ASSERT_TRUE(kv.ok());
  auto& c = **kv;
  ASSERT_TRUE(c.add_sequence(1).is_ok());
  ASSERT_TRUE(c.append(1, 3).is_ok());
  const int64_t n = cfg.n_kv_heads * hd;
  std::vector<float> k(n), v(n), out(n);
  for (int64_t pos = 0; pos < 3; ++pos) {
    for (int64_t i = 0; i < n; ++i) {
      k[i] = std::sin(1.7f * i + pos) * std::exp(0.21f * (i % 23) - 2.0f);
      v[i] = i % 5 == 0 ? 0.0f : -k[i] * 3.3f;
    }
    c.write(0, 1, pos, k.data(), v.data());
    for (const auto* x : {&k, &v}) {
      (x == &k ? c.read_k(0, 1, pos, out.data()) : c.read_v(0, 1, pos, out.data()));
      for (int64_t h = 0; h < cfg.n_kv_heads; ++h) {
        float amax = 0;
        for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::fabs((*x)[h * hd + i]));
        const float s = amax > 0 ? amax / kFp8E4M3Max : 1.0f, inv = 1.0f / s;
        for (int64_t i = 0; i < hd; ++i) {
          const float xi = (*x)[h * hd + i];
          const float want = dt == DType::bf16 ? bf16_to_f32(f32_to_bf16(xi).bits)
                                               : fp8_e4m3_to_f32(f32_to_fp8_e4m3(xi * inv)) * s;
          ASSERT_EQ(f32_bits(out[h * hd + i]), f32_bits(want)) << dtype_name(dt) << " pos " << pos << " i " << i;
        }
      }
    }
  }
}

TEST(PagedKvCache, StoresExactlyAsTheScalarRounding) {
  for (int64_t hd : {int64_t{8}, int64_t{40}}) {
    check_exact_store(DType::bf16, hd);
    check_exact_store(DType::f8_e4m3, hd);
  }
}

// K-only layout (MLA's latent cache: one 576-wide row per token and layer, no V): rows round
// trip in every dtype, the storage and bytes_per_token count K alone (plus one fp8 scale per
// row), and a reused prefix reads back exactly what was written.
void check_k_only(DType dt, float tol_rel) {
  KvCacheConfig cfg;
  cfg.n_layers = 3;
  cfg.n_kv_heads = 1;
  cfg.head_dim = 576;
  cfg.block_size = 4;
  cfg.n_blocks = 5;
  cfg.dtype = dt;
  cfg.k_only = true;
  auto kv = PagedKvCache::create(cfg);
  ASSERT_TRUE(kv.ok());
  auto& c = **kv;
  const size_t want = 3 * (576 * dtype_size(dt) + (dt == DType::f8_e4m3 ? sizeof(float) : 0));
  EXPECT_EQ(c.bytes_per_token(), want);
  EXPECT_EQ(c.storage_bytes(), want * 20);
  KvCacheConfig both = cfg;
  both.k_only = false;
  EXPECT_EQ((*PagedKvCache::create(both))->bytes_per_token(), 2 * want);

  auto row = [](int64_t pos, int64_t l, int64_t i) {
    // latent-like values ~1 and a smaller rope key tail
    return std::sin(0.37f * i + 1.3f * pos + 7.0f * l) * (i < 512 ? 1.0f : 0.1f);
  };
  std::vector<int32_t> toks = {5, 6, 7, 8, 9};
  ASSERT_TRUE(c.add_sequence(1).is_ok());
  ASSERT_TRUE(c.append(1, 5).is_ok());
  std::vector<float> k(576), out(576);
  for (int64_t pos = 0; pos < 5; ++pos)
    for (int64_t l = 0; l < 3; ++l) {
      for (int64_t i = 0; i < 576; ++i) k[i] = row(pos, l, i);
      c.write(l, 1, pos, k.data(), nullptr);
    }
  c.commit_tokens(1, toks);
  for (int64_t pos = 0; pos < 5; ++pos)
    for (int64_t l = 0; l < 3; ++l) {
      c.read_k(l, 1, pos, out.data());
      float amax = 0;
      for (int64_t i = 0; i < 576; ++i) amax = std::max(amax, std::fabs(row(pos, l, i)));
      for (int64_t i = 0; i < 576; ++i)
        ASSERT_NEAR(out[i], row(pos, l, i), tol_rel * (dt == DType::f8_e4m3 ? amax : std::fabs(row(pos, l, i))))
            << dtype_name(dt) << " pos " << pos << " layer " << l << " i " << i;
    }
  EXPECT_THROW(c.read_v(0, 1, 0, out.data()), InternalError);
  // Prefix reuse: the first full block (positions 0..3) maps into a new sequence.
  std::vector<float> before(576);
  c.read_k(2, 1, 3, before.data());
  c.remove_sequence(1);
  ASSERT_TRUE(c.add_sequence(2).is_ok());
  ASSERT_EQ(c.reuse_prefix(2, toks, 4), 4);
  c.read_k(2, 2, 3, out.data());
  EXPECT_EQ(out, before);
}

TEST(PagedKvCache, KOnlyLayoutF32) { check_k_only(DType::f32, 0.0f); }
TEST(PagedKvCache, KOnlyLayoutBf16) { check_k_only(DType::bf16, 1.0f / 256); }
TEST(PagedKvCache, KOnlyLayoutFp8) { check_k_only(DType::f8_e4m3, 1.0f / 16); }

TEST(PagedKvCache, RejectsBadConfig) {
  auto c = small_cfg(DType::i32);
  EXPECT_FALSE(PagedKvCache::create(c).ok());
  c = small_cfg(DType::bf16);
  c.n_blocks = 0;
  EXPECT_FALSE(PagedKvCache::create(c).ok());
}


// ---- prefix cache (block_size 4, 6 blocks) ----

std::unique_ptr<PagedKvCache> cache(DType dt = DType::f32, bool caching = true) {
  auto c = small_cfg(dt);
  c.prefix_caching = caching;
  auto kv = PagedKvCache::create(c);
  EXPECT_TRUE(kv.ok());
  return std::move(*kv);
}

std::vector<int32_t> seq_tokens(int32_t base, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = base + i;
  return t;
}

// Appends `toks` to seq as one successful step would (append, then commit).
void compute(PagedKvCache& c, int64_t seq, const std::vector<int32_t>& toks) {
  ASSERT_TRUE(c.append(seq, static_cast<int64_t>(toks.size())).is_ok());
  c.commit_tokens(seq, toks);
}

TEST(PrefixCache, FullBlocksHitPartialBlocksDoNot) {
  auto c = cache();
  auto a = seq_tokens(10, 10);  // blocks [10..13] [14..17], partial [18, 19]
  ASSERT_TRUE(c->add_sequence(1).is_ok());
  compute(*c, 1, a);
  EXPECT_EQ(c->committed_tokens(1), 10);
  const auto ta = c->block_table(1);
  EXPECT_TRUE(c->block_registered(ta[0]));
  EXPECT_TRUE(c->block_registered(ta[1]));
  EXPECT_FALSE(c->block_registered(ta[2]));  // partial: never registered
  EXPECT_EQ(c->match_prefix(a), 8);

  ASSERT_TRUE(c->add_sequence(2).is_ok());
  EXPECT_EQ(c->reuse_prefix(2, a, 9), 8);
  EXPECT_EQ(c->length(2), 8);
  EXPECT_EQ(c->committed_tokens(2), 8);
  EXPECT_EQ(c->block_table(2)[0], ta[0]);
  EXPECT_EQ(c->block_table(2)[1], ta[1]);
  EXPECT_EQ(c->block_refs(ta[0]), 2);
  EXPECT_EQ(c->block_refs(ta[2]), 1);
  EXPECT_EQ(c->n_used_blocks(), 3);  // shared blocks counted once
  // The cap rounds down to whole blocks: 7 tokens allow one block only.
  ASSERT_TRUE(c->add_sequence(3).is_ok());
  EXPECT_EQ(c->reuse_prefix(3, a, 7), 4);
  // A non-empty sequence is left alone.
  EXPECT_EQ(c->reuse_prefix(3, a, 9), 0);
  EXPECT_EQ(c->length(3), 4);
  // A miss: different first block.
  ASSERT_TRUE(c->add_sequence(4).is_ok());
  EXPECT_EQ(c->reuse_prefix(4, seq_tokens(11, 10), 9), 0);
  EXPECT_EQ(c->length(4), 0);
  PrefixCacheStats st = c->prefix_stats();
  EXPECT_EQ(st.queries, 10 + 10 + 10);  // the refused call on a non-empty sequence is not a query
  EXPECT_EQ(st.hits, 8 + 4);
}

TEST(PrefixCache, KeysChainThroughTheParentBlock) {
  auto c = cache();
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(c->add_sequence(1).is_ok());
  compute(*c, 1, a);
  // Same second block, different first block: the second block must not match.
  std::vector<int32_t> b = {0, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(c->match_prefix(b), 0);
  // Same first block, different second block: one block.
  std::vector<int32_t> d = {1, 2, 3, 4, 5, 6, 7, 0, 9};
  EXPECT_EQ(c->match_prefix(d), 4);
  // A sequence whose block 1 holds a's block-0 tokens: position matters through the chain.
  std::vector<int32_t> e = {5, 6, 7, 8, 1, 2, 3, 4, 9};
  EXPECT_EQ(c->match_prefix(e), 0);
  // Committing in several steps registers the same keys as one step.
  ASSERT_TRUE(c->add_sequence(2).is_ok());
  compute(*c, 2, {0, 2});
  compute(*c, 2, {3, 4, 5});
  compute(*c, 2, {6, 7, 8, 9});
  EXPECT_EQ(c->match_prefix(b), 8);
  EXPECT_EQ(c->match_prefix(a), 8);
}

TEST(PrefixCache, RemovedBlocksAreEvictableAndEvictedLeastRecentlyUsedFirst) {
  auto c = cache();
  auto a = seq_tokens(100, 8), b = seq_tokens(200, 8);
  ASSERT_TRUE(c->add_sequence(1).is_ok());
  compute(*c, 1, a);
  ASSERT_TRUE(c->add_sequence(2).is_ok());
  compute(*c, 2, b);
  c->remove_sequence(1);  // evictable, LRU order: a1, a0
  c->remove_sequence(2);  // then b1, b0
  EXPECT_EQ(c->n_used_blocks(), 0);
  EXPECT_EQ(c->n_evictable_blocks(), 4);
  EXPECT_EQ(c->n_free_blocks(), 6);
  EXPECT_EQ(c->match_prefix(a), 8);
  // Touch a: reusing a's blocks and releasing them again makes them most recently used.
  ASSERT_TRUE(c->add_sequence(3).is_ok());
  EXPECT_EQ(c->reuse_prefix(3, a, 8), 8);
  EXPECT_EQ(c->n_evictable_blocks(), 2);
  EXPECT_EQ(c->n_used_blocks(), 2);
  c->remove_sequence(3);  // LRU order now: b1, b0, a1, a0
  // 3 blocks without tokens: the 2 truly free blocks first, then b's last block.
  ASSERT_TRUE(c->add_sequence(4).is_ok());
  ASSERT_TRUE(c->append(4, 12).is_ok());
  EXPECT_EQ(c->n_evictable_blocks(), 3);
  EXPECT_EQ(c->match_prefix(b), 4);
  EXPECT_EQ(c->match_prefix(a), 8);
  // Two more: b0, then a1.
  ASSERT_TRUE(c->append(4, 8).is_ok());
  EXPECT_EQ(c->match_prefix(b), 0);
  EXPECT_EQ(c->match_prefix(a), 4);
  EXPECT_EQ(c->n_free_blocks(), 1);
  EXPECT_EQ(c->append(4, 8).code(), StatusCode::resource_exhausted);
  ASSERT_TRUE(c->append(4, 4).is_ok());  // the last evictable block
  EXPECT_EQ(c->match_prefix(a), 0);
  EXPECT_EQ(c->n_free_blocks(), 0);
  c->remove_sequence(4);  // never committed: freed, not cached
  EXPECT_EQ(c->n_evictable_blocks(), 0);
  EXPECT_EQ(c->n_free_blocks(), 6);
}

TEST(PrefixCache, SharedBlocksSurviveEitherRemovalOrder) {
  for (int first : {1, 2}) {
    auto c = cache();
    auto a = seq_tokens(7, 10);
    ASSERT_TRUE(c->add_sequence(1).is_ok());
    compute(*c, 1, a);
    ASSERT_TRUE(c->add_sequence(2).is_ok());
    ASSERT_EQ(c->reuse_prefix(2, a, 9), 8);
    compute(*c, 2, {7 + 8, 42});  // b diverges in its own third block
    const auto ta = c->block_table(1), tb = c->block_table(2);
    ASSERT_EQ(tb.size(), 3u);
    EXPECT_NE(ta[2], tb[2]);
    EXPECT_EQ(c->n_used_blocks(), 4);
    const int second = 3 - first;
    c->remove_sequence(first);
    EXPECT_EQ(c->block_refs(ta[0]), 1);
    EXPECT_EQ(c->block_refs(ta[1]), 1);
    EXPECT_EQ(c->n_used_blocks(), 3);  // the removed one's partial block is free
    EXPECT_EQ(c->n_evictable_blocks(), 0);
    EXPECT_EQ(c->length(second), 10);
    c->remove_sequence(second);
    EXPECT_EQ(c->block_refs(ta[0]), 0);
    EXPECT_EQ(c->n_used_blocks(), 0);
    EXPECT_EQ(c->n_evictable_blocks(), 2);
    EXPECT_EQ(c->match_prefix(a), 8);
  }
}

TEST(PrefixCache, RollbackOfAFailedStepNeverTouchesSharedBlocks) {
  auto c = cache();
  auto a = seq_tokens(3, 8);
  ASSERT_TRUE(c->add_sequence(1).is_ok());
  compute(*c, 1, a);
  ASSERT_TRUE(c->add_sequence(2).is_ok());
  ASSERT_EQ(c->reuse_prefix(2, a, 8), 8);
  const auto shared = c->block_table(2);
  // A failed step: appended, not committed, rolled back to the reused length.
  ASSERT_TRUE(c->append(2, 6).is_ok());
  EXPECT_EQ(c->block_table(2).size(), 4u);
  c->truncate(2, 8);
  EXPECT_EQ(c->block_table(2), shared);
  EXPECT_EQ(c->block_refs(shared[0]), 2);
  EXPECT_EQ(c->block_refs(shared[1]), 2);
  EXPECT_EQ(c->committed_tokens(2), 8);
  EXPECT_EQ(c->n_used_blocks(), 2);
  // The same on a fresh sequence: nothing registered by the failed attempt.
  ASSERT_TRUE(c->add_sequence(3).is_ok());
  ASSERT_TRUE(c->append(3, 8).is_ok());
  c->truncate(3, 0);
  EXPECT_EQ(c->committed_tokens(3), 0);
  // The retried step commits as usual and continues the shared chain.
  auto more = seq_tokens(11, 4);
  compute(*c, 2, more);
  std::vector<int32_t> all = a;
  all.insert(all.end(), more.begin(), more.end());
  EXPECT_EQ(c->match_prefix(all), 12);
  // Truncating below committed tokens is a broken internal invariant, not a silent corruption.
  EXPECT_THROW(c->truncate(2, 5), InternalError);
}

TEST(PrefixCache, DuplicateContentStaysPrivateAndIsFreed) {
  auto c = cache();
  auto a = seq_tokens(50, 8);
  ASSERT_TRUE(c->add_sequence(1).is_ok());
  ASSERT_TRUE(c->add_sequence(2).is_ok());
  compute(*c, 1, a);  // registered
  compute(*c, 2, a);  // computed concurrently: same content, a private copy
  const auto tb = c->block_table(2);
  EXPECT_FALSE(c->block_registered(tb[0]));
  // Its chain still continues under the registered key.
  compute(*c, 2, seq_tokens(58, 4));
  auto ext = seq_tokens(50, 12);
  EXPECT_EQ(c->match_prefix(ext), 12);
  c->remove_sequence(1);
  c->remove_sequence(2);
  EXPECT_EQ(c->n_evictable_blocks(), 3);  // a0, a1 (from 1), the third block (from 2)
  EXPECT_EQ(c->n_free_blocks(), 6);
}

TEST(PrefixCache, PositionsWithoutTokensStopCaching) {
  auto c = cache();
  ASSERT_TRUE(c->add_sequence(1).is_ok());
  ASSERT_TRUE(c->append(1, 4).is_ok());  // e.g. a synthetic context: no token ids
  compute(*c, 1, seq_tokens(0, 4));      // tokens for positions 4..7 only
  EXPECT_EQ(c->committed_tokens(1), 0);
  EXPECT_EQ(c->match_prefix(seq_tokens(0, 4)), 0);
  c->remove_sequence(1);
  EXPECT_EQ(c->n_evictable_blocks(), 0);
}

TEST(PrefixCache, DisabledCachesNothing) {
  auto c = cache(DType::f32, /*caching=*/false);
  auto a = seq_tokens(0, 8);
  ASSERT_TRUE(c->add_sequence(1).is_ok());
  compute(*c, 1, a);
  EXPECT_EQ(c->committed_tokens(1), 0);
  c->remove_sequence(1);
  EXPECT_EQ(c->n_evictable_blocks(), 0);
  ASSERT_TRUE(c->add_sequence(2).is_ok());
  EXPECT_EQ(c->reuse_prefix(2, a, 8), 0);
  EXPECT_EQ(c->prefix_stats().queries, 0);
}

// Shared blocks carry their per-slot fp8 scales: a sequence that reuses them reads exactly
// what the writer stored.
void check_shared_kv_reads(DType dt) {
  auto c = cache(dt);
  auto a = seq_tokens(0, 9);
  ASSERT_TRUE(c->add_sequence(1).is_ok());
  ASSERT_TRUE(c->append(1, 9).is_ok());
  std::vector<float> k(16), v(16);
  for (int64_t pos = 0; pos < 9; ++pos)
    for (int64_t l = 0; l < 2; ++l) {
      for (int i = 0; i < 16; ++i) {
        k[i] = std::cos(0.7f * i + pos + 10 * l) * (1 + i + 5 * pos);
        v[i] = std::sin(0.2f * i - pos) * (3 + l);
      }
      c->write(l, 1, pos, k.data(), v.data());
    }
  c->commit_tokens(1, a);
  std::vector<std::vector<float>> before;
  for (int64_t pos = 0; pos < 8; ++pos)
    for (int64_t l = 0; l < 2; ++l) {
      std::vector<float> ok(16), ov(16);
      c->read_k(l, 1, pos, ok.data());
      c->read_v(l, 1, pos, ov.data());
      before.push_back(ok);
      before.push_back(ov);
    }
  c->remove_sequence(1);
  ASSERT_TRUE(c->add_sequence(2).is_ok());
  ASSERT_EQ(c->reuse_prefix(2, a, 8), 8);
  size_t idx = 0;
  for (int64_t pos = 0; pos < 8; ++pos)
    for (int64_t l = 0; l < 2; ++l) {
      std::vector<float> ok(16), ov(16);
      c->read_k(l, 2, pos, ok.data());
      c->read_v(l, 2, pos, ov.data());
      EXPECT_EQ(ok, before[idx++]) << "k pos " << pos;
      EXPECT_EQ(ov, before[idx++]) << "v pos " << pos;
    }
  // Appending after the shared prefix writes into a new private block.
  ASSERT_TRUE(c->append(2, 1).is_ok());
  EXPECT_EQ(c->block_refs(c->block_table(2)[2]), 1);
  EXPECT_FALSE(c->block_registered(c->block_table(2)[2]));
}

TEST(PrefixCache, SharedBlocksReadBackExactlyF32) { check_shared_kv_reads(DType::f32); }
TEST(PrefixCache, SharedBlocksReadBackExactlyFp8) { check_shared_kv_reads(DType::f8_e4m3); }

}  // namespace
}  // namespace afd
