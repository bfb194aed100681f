// Test helpers for the attention variants: a paged KV cache laid out for a config's attention
// kind (kv_layout), one layer; random norm weights.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kv/paged_kv_cache.h"
#include "model/attention_variant.h"
#include "model/weights.h"

namespace afd::test {

inline std::unique_ptr<PagedKvCache> make_attention_kv(const ModelConfig& c, int64_t block_size, int64_t n_blocks,
                                                       DType dtype) {
  const KvLayout l = kv_layout(c);
  KvCacheConfig kc;
  kc.n_layers = 1;
  kc.n_kv_heads = l.n_kv_heads;
  kc.head_dim = l.k_dim;
  kc.k_only = l.v_dim == 0;
  kc.block_size = block_size;
  kc.n_blocks = n_blocks;
  kc.dtype = dtype;
  auto kv = PagedKvCache::create(kc);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return kv.ok() ? std::move(*kv) : nullptr;
}

// n weights around 1 (sd 0.1), stored as a new vector of `store` (moving the vectors keeps
// their data, so the view stays valid while store lives).
inline Vector random_norm(std::vector<std::vector<float>>& store, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(1.0f, 0.1f);
  store.emplace_back(static_cast<size_t>(n));
  for (auto& v : store.back()) v = d(rng);
  return Vector{store.back().data(), n};
}

}  // namespace afd::test
