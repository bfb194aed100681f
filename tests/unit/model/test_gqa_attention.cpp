// gqa_attend_one against a direct scalar computation from the same K/V values, for each KV
// dtype, GQA group sizes and a sliding window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
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
  ScratchSlot scratch;
  std::vector<float> q(n_heads * 16), got(n_heads * 16), want(n_heads * 16);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.5f * i);
  for (int64_t g = 0; g < n_kv; ++g) {
    gqa_attend_one(**kv, 0, 0, n_ctx, g, s, q.data(), got.data(), scratch);
    direct(K, V, q.data(), s, n_ctx, g, want.data());
  }
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << i;
}

TEST(GqaAttention, F32) { run(DType::f32, 4, 2, 0, 1e-5f); }
TEST(GqaAttention, Bf16) { run(DType::bf16, 8, 2, 0, 1e-5f); }
TEST(GqaAttention, Fp8) { run(DType::f8_e4m3, 4, 4, 0, 1e-5f); }
TEST(GqaAttention, SlidingWindow) { run(DType::f32, 4, 1, 5, 1e-5f); }

// ---- Against a float64 reference, over the shapes the AVX-512 tiled kernel distinguishes ----
// (16-position tiles that straddle pages, partial last tiles, head groups of up to 8 heads in
// registers, head_dim not a multiple of 16 taking the generic path). The reference works in
// double on exactly the values the cache holds (read_k / read_v), so the tolerance only
// covers the kernel's f32 arithmetic.

struct Case {
  DType dt;
  int64_t head_dim, G, n_kv, n_ctx, window, block_size;
};

std::string name(const Case& c) {
  return std::string(dtype_name(c.dt)) + " hd=" + std::to_string(c.head_dim) + " G=" + std::to_string(c.G) +
         " n_kv=" + std::to_string(c.n_kv) + " ctx=" + std::to_string(c.n_ctx) + " window=" +
         std::to_string(c.window) + " bs=" + std::to_string(c.block_size);
}

void run_f64(const Case& c) {
  SCOPED_TRACE(name(c));
  const int64_t hd = c.head_dim, d = c.n_kv * hd, n_heads = c.G * c.n_kv;
  KvCacheConfig kc;
  kc.n_layers = 2;
  kc.n_kv_heads = c.n_kv;
  kc.head_dim = hd;
  kc.block_size = c.block_size;
  kc.n_blocks = 2 * ((c.n_ctx + c.block_size - 1) / c.block_size) + 2;
  kc.dtype = c.dt;
  auto kv = PagedKvCache::create(kc);
  ASSERT_TRUE(kv.ok());
  // Sequence 1 is interleaved with sequence 0 so that 0's block table is not contiguous.
  ASSERT_TRUE((*kv)->add_sequence(0).is_ok());
  ASSERT_TRUE((*kv)->add_sequence(1).is_ok());
  for (int64_t j = 0; j < c.n_ctx; j += c.block_size) {
    ASSERT_TRUE((*kv)->append(1, std::min(c.block_size, c.n_ctx - j)).is_ok());
    ASSERT_TRUE((*kv)->append(0, std::min(c.block_size, c.n_ctx - j)).is_ok());
  }
  std::vector<std::vector<float>> K(c.n_ctx, std::vector<float>(d)), V = K;
  std::vector<float> junk(d, 7.0f);
  for (int64_t j = 0; j < c.n_ctx; ++j) {
    for (int64_t i = 0; i < d; ++i) {
      // Magnitudes over ~3 decades inside a row, so fp8 rows use subnormal codes too.
      const float mag = std::pow(10.0f, -3.0f * static_cast<float>((i * 7 + j * 3) % 11) / 10.0f);
      K[j][i] = mag * std::sin(0.37f * i + 1.3f * j + 0.2f);
      V[j][i] = mag * std::cos(0.11f * i - 0.7f * j);
    }
    (*kv)->write(1, 0, j, K[j].data(), V[j].data());  // layer 1 is the one attended
    (*kv)->write(0, 0, j, junk.data(), junk.data());
    (*kv)->write(1, 1, j, junk.data(), junk.data());
    (*kv)->read_k(1, 0, j, K[j].data());
    (*kv)->read_v(1, 0, j, V[j].data());
  }
  GqaShape s{n_heads, c.n_kv, hd, c.window};
  ScratchSlot scratch;
  std::vector<float> q(n_heads * hd), got(n_heads * hd, -1.0f), want(n_heads * hd);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 1.5f * std::sin(0.5f * i + 0.1f);
  for (int64_t g = 0; g < c.n_kv; ++g) {
    gqa_attend_one(**kv, 1, 0, c.n_ctx, g, s, q.data(), got.data(), scratch);
    direct(K, V, q.data(), s, c.n_ctx, g, want.data());
  }
  double max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
  EXPECT_LT(max_err, 2e-6) << "max abs error vs float64";
}

TEST(GqaAttentionF64, HeadDimGroupDtype) {
  for (DType dt : {DType::bf16, DType::f32, DType::f8_e4m3})
    for (int64_t hd : {64, 128, 40, 17})  // 40, 17: not multiples of 16, generic path
      for (int64_t G : {1, 2, 4, 8}) run_f64({dt, hd, G, 2, 37, 0, 16});
}

TEST(GqaAttentionF64, ContextLengths) {
  // 1 position, exactly one tile, one tile + 1, several tiles with a partial last one.
  for (DType dt : {DType::bf16, DType::f32, DType::f8_e4m3})
    for (int64_t ctx : {1, 15, 16, 17, 100, 300}) run_f64({dt, 128, 8, 1, ctx, 0, 16});
}

TEST(GqaAttentionF64, PagesStraddleTiles) {
  for (DType dt : {DType::bf16, DType::f32, DType::f8_e4m3})
    for (int64_t bs : {5, 24, 32}) run_f64({dt, 64, 4, 2, 101, 0, bs});
}

TEST(GqaAttentionF64, SlidingWindow) {
  for (DType dt : {DType::bf16, DType::f32, DType::f8_e4m3})
    for (int64_t w : {1, 7, 16, 40}) run_f64({dt, 128, 4, 2, 90, w, 16});
  run_f64({DType::bf16, 40, 2, 1, 50, 9, 5});
}

TEST(GqaAttentionF64, LargeGroups) {
  // More than the 8 heads kept in registers per P.V pass.
  for (DType dt : {DType::bf16, DType::f8_e4m3})
    for (int64_t G : {9, 16}) run_f64({dt, 64, G, 1, 45, 0, 16});
}

}  // namespace
}  // namespace afd
