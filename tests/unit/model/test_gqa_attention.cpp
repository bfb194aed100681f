// gqa_attend_one against a direct scalar computation from the same K/V values, for each KV
// dtype, GQA group sizes and a sliding window.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/gqa_attention.h"

namespace afd {
namespace {

void direct(const std::vector<std::vector<float>>& K, const std::vector<std::vector<float>>& V, const float* q,
            const GqaShape& s, int64_t n_ctx, int64_t g, float* out) {
  const int64_t G = s.n_heads / s.n_kv_heads, hd = s.head_dim;
  const int64_t j0 = (s.window > 0 && n_ctx > s.window) ? n_ctx - s.window : 0;
  for (int64_t h = g * G; h < (g + 1) * G; ++h) {
    std::vector<double> sc;
    double mx = -1e300;
    for (int64_t j = j0; j < n_ctx; ++j) {
      double d = 0;
      for (int64_t i = 0; i < hd; ++i) d += q[h * hd + i] * K[j][g * hd + i];
      sc.push_back(d / std::sqrt(double(hd)));
      mx = std::max(mx, sc.back());
    }
    double z = 0;
    for (double& v : sc) z += (v = std::exp(v - mx));
    for (int64_t i = 0; i < hd; ++i) {
      double acc = 0;
      for (int64_t j = j0; j < n_ctx; ++j) acc += sc[j - j0] / z * V[j][g * hd + i];
      out[h * hd + i] = static_cast<float>(acc);
    }
  }
}

void run(DType dt, int64_t n_heads, int64_t n_kv, int64_t window, float tol) {
  KvCacheConfig c;
  c.n_layers = 1;
  c.n_kv_heads = n_kv;
  c.head_dim = 16;
  c.block_size = 4;
  c.n_blocks = 16;
  c.dtype = dt;
  auto kv = PagedKvCache::create(c);
  ASSERT_TRUE(kv.ok());
  const int64_t n_ctx = 23, d = n_kv * 16;
  ASSERT_TRUE((*kv)->add_sequence(0).is_ok());
  ASSERT_TRUE((*kv)->append(0, n_ctx).is_ok());
  std::vector<std::vector<float>> K(n_ctx, std::vector<float>(d)), V = K;
  for (int64_t j = 0; j < n_ctx; ++j) {
    for (int64_t i = 0; i < d; ++i) {
      K[j][i] = std::sin(0.37f * i + 1.3f * j);
      V[j][i] = std::cos(0.11f * i - 0.7f * j);
    }
    (*kv)->write(0, 0, j, K[j].data(), V[j].data());
    (*kv)->read_k(0, 0, j, K[j].data());  // compare against what the cache holds
    (*kv)->read_v(0, 0, j, V[j].data());
  }
  GqaShape s{n_heads, n_kv, 16, window};
  std::vector<float> q(n_heads * 16), got(n_heads * 16), want(n_heads * 16);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.5f * i);
  for (int64_t g = 0; g < n_kv; ++g) {
    gqa_attend_one(**kv, 0, 0, n_ctx, g, s, q.data(), got.data());
    direct(K, V, q.data(), s, n_ctx, g, want.data());
  }
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << i;
}

TEST(GqaAttention, F32) { run(DType::f32, 4, 2, 0, 1e-5f); }
TEST(GqaAttention, Bf16) { run(DType::bf16, 8, 2, 0, 1e-5f); }
TEST(GqaAttention, Fp8) { run(DType::f8_e4m3, 4, 4, 0, 1e-5f); }
TEST(GqaAttention, SlidingWindow) { run(DType::f32, 4, 1, 5, 1e-5f); }

}  // namespace
}  // namespace afd
