// MqaDecodeRunner (model/attention_variant.h): whether it runs one task per item or spreads the
// items' split-K segments over the pool, every output bit equals kernels::mqa_decode_attend.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "model/attention_variant.h"

namespace afd {
namespace {

// Rows of n_ctx positions of dim values in bf16, in blocks of 16.
struct Rows {
  std::vector<std::vector<uint16_t>> blocks;
  std::vector<const uint8_t*> ptrs;
  kernels::PagedRows view;
  Rows(int64_t n_ctx, int64_t dim, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1, 1);
    const int64_t bs = 16, nb = (n_ctx + bs - 1) / bs;
    blocks.resize(static_cast<size_t>(nb));
    for (auto& b : blocks) {
      b.resize(static_cast<size_t>(bs * dim));
      for (auto& x : b) x = f32_to_bf16(d(rng)).bits;
      ptrs.push_back(reinterpret_cast<const uint8_t*>(b.data()));
    }
    view = kernels::PagedRows{ptrs.data(), nullptr, bs, dim, DType::bf16};
  }
};

TEST(MqaDecodeRunner, SplitOrNotGivesTheSameBits) {
  const int64_t D = 96, v_dim = 64, heads = 16;
  // Contexts inside one segment, at a segment edge and over several segments.
  const std::vector<int64_t> ctxs = {1, kernels::kMqaSegment, kernels::kMqaSegment + 1, 3 * kernels::kMqaSegment + 50};
  std::vector<Rows> rows;
  for (size_t i = 0; i < ctxs.size(); ++i) rows.emplace_back(ctxs[i], D, static_cast<uint32_t>(10 + i));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> q(ctxs.size() * heads * D);
  for (auto& x : q) x = d(rng);
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    ScratchArena scratch(threads);
    MqaDecodeRunner runner;
    // Each item alone (fewer items than threads: split-K once threads > 1) and all together.
    for (size_t first = 0; first <= ctxs.size(); ++first) {
      const size_t b = first == ctxs.size() ? 0 : first, e = first == ctxs.size() ? ctxs.size() : first + 1;
      std::vector<MqaItem> items;
      std::vector<float> got(ctxs.size() * heads * v_dim, -1.0f), want(got.size(), -2.0f);
      for (size_t i = b; i < e; ++i) {
        items.push_back(MqaItem{&q[i * heads * D], D, heads, &rows[i].view, nullptr, v_dim, ctxs[i],
                                &got[i * heads * v_dim], v_dim});
        kernels::mqa_decode_attend(&q[i * heads * D], D, heads, rows[i].view, nullptr, v_dim, ctxs[i], 0.1f,
                                   &want[i * heads * v_dim], v_dim, scratch.slot(0));
      }
      runner.run(pool, scratch, items, 0.1f);
      for (size_t i = b * heads * v_dim; i < e * heads * v_dim; ++i)
        ASSERT_EQ(f32_bits(got[i]), f32_bits(want[i])) << "threads " << threads << " items " << b << ".." << e << " at " << i;
    }
  }
}

}  // namespace
}  // namespace afd
