// ffn_part on a pool equals ffn_part on the calling thread alone, bit for bit: the
// expert-parallel mode (whole experts per pool thread, decode-sized buckets) and the
// per-expert mode (each product split over the pool, large buckets) must both keep the
// numbers of the sequential computation, whatever the pool size, with and without an
// experts mask, in both activation precisions, with bf16 and FP8 block weights. The library
// sgemm path (CPUs without AVX-512 BF16, >= 64 rows) is switched off here: its numbers depend
// on the block of rows it is handed (kernels test ResultsDoNotDependOnThePoolSize).
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "kernels/cpu/linear_kernels.h"
#include "model/ffn_part.h"
#include "tiny_model.h"

namespace afd {
namespace {

struct Routed {
  std::vector<float> h, w;
  std::vector<int32_t> ids;
};

// n tokens, k distinct experts of E each; `hot` sends every token to experts 0..k-1
// (buckets of n rows, past the expert-parallel limit).
Routed route(int64_t n, int64_t hidden, int64_t E, int64_t k, bool hot, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Routed r;
  r.h.resize(static_cast<size_t>(n * hidden));
  for (float& v : r.h) v = u(g);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    if (!hot) std::shuffle(perm.begin(), perm.end(), g);
    for (int64_t j = 0; j < k; ++j) {
      r.ids.push_back(perm[static_cast<size_t>(j)]);
      r.w.push_back(0.25f + 0.5f * (u(g) + 1.0f));
    }
  }
  return r;
}

class FfnPart : public ::testing::TestWithParam<DType> {};

TEST_P(FfnPart, PoolResultsEqualTheSingleThreadResultBitForBit) {
  const DType dtype = GetParam();
  auto w = test::make_tiny_moe(std::string("ffn_part_pool_") + dtype_name(dtype), 2, 7, {}, dtype);
  ASSERT_NE(w, nullptr);
  const ModelConfig& c = w->config;
  const int64_t H = c.hidden_size, E = c.n_experts, K = c.n_experts_per_tok;
  ThreadPool p2(2), p3(3), p4(4);
  for (auto prec : {kernels::ActPrecision::f32, kernels::ActPrecision::bf16})
    for (bool masked : {false, true})
      for (auto [n, hot] : {std::pair<int64_t, bool>{1, false}, {3, false}, {17, false}, {40, false}, {90, true}}) {
        const Routed r = route(n, H, E, K, hot, static_cast<uint32_t>(n * 31 + masked));
        FfnPartOptions o;
        o.prec = prec;
        // Where the fastest order hands these products to OpenBLAS (AVX2, many tokens), whose
        // sums follow its own blocking of the rows, the batch-invariant order keeps the tiles.
        for (DType wd : {DType::bf16, DType::f32})
          for (auto ap : {prec, kernels::ActPrecision::f32})
            if (std::string(kernels::linear_path_name(n, wd, ap, H)) == "openblas_sgemm")
              o.order = kernels::LinearOrder::batch_invariant;
        if (masked) {
          o.experts_mask.assign(static_cast<size_t>(E), 0);
          for (int64_t e = 0; e < E; e += 2) o.experts_mask[static_cast<size_t>(e)] = 1;
        }
        FfnScratch s;
        std::vector<float> want(r.h.size()), got(r.h.size());
        ffn_part(*w, 1, r.h.data(), n, r.ids.data(), r.w.data(), want.data(), o, &s, nullptr);
        for (ThreadPool* pool : {&p2, &p3, &p4}) {
          ffn_part(*w, 1, r.h.data(), n, r.ids.data(), r.w.data(), got.data(), o, &s, pool);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << "n=" << n << " hot=" << hot << " masked=" << masked << " threads=" << pool->size()
              << " prec=" << (prec == kernels::ActPrecision::f32 ? "f32" : "bf16");
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Weights, FfnPart, ::testing::Values(DType::bf16, DType::f8_e4m3),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace afd
