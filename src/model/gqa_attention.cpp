#include "model/gqa_attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"

#define AFD_ALWAYS_INLINE inline __attribute__((always_inline))

namespace afd {

namespace {

// Converts head g of a KV row to f32.
AFD_ALWAYS_INLINE void load_head(const uint8_t* row, const float* scales, DType dt, int64_t g, int64_t hd,
                                 float* out) {
  if (dt == DType::bf16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + g * hd;
    for (int64_t i = 0; i < hd; ++i) out[i] = f32_from_bits(static_cast<uint32_t>(p[i]) << 16);
  } else if (dt == DType::f32) {
    std::memcpy(out, reinterpret_cast<const float*>(row) + g * hd, static_cast<size_t>(hd) * 4);
  } else {
    const uint8_t* p = row + g * hd;
    const float s = scales[g];
    for (int64_t i = 0; i < hd; ++i) out[i] = fp8_e4m3_to_f32(p[i]) * s;
  }
}

// 16 independent partial sums so the compiler can vectorise without reassociating.
AFD_ALWAYS_INLINE float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}

AFD_ALWAYS_INLINE void attend_impl(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                                   const GqaShape& s, const float* q, float* out) {
  const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads, bs = kv.config().block_size;
  const DType dt = kv.config().dtype;
  const bool fp8 = dt == DType::f8_e4m3;
  const auto& table = kv.block_table(seq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  thread_local std::vector<float> scores, row;
  scores.resize(static_cast<size_t>(G * n_ctx));  // [G, n_ctx - j0] used
  row.resize(static_cast<size_t>(hd));
  float* r = row.data();
  const float* qg = q + g * G * hd;
  float* og = out + g * G * hd;
  // Sliding window: only the last s.window positions (HF Mixtral semantics).
  const int64_t j0 = (s.window > 0 && n_ctx > s.window) ? n_ctx - s.window : 0;

  const int64_t n = n_ctx - j0;
  for (int64_t j = j0; j < n_ctx; ++j) {
    int64_t blk = table[j / bs], slot = j % bs;
    load_head(kv.k_row(layer, blk, slot), fp8 ? kv.k_scales(layer, blk, slot) : nullptr, dt, g, hd, r);
    for (int64_t h = 0; h < G; ++h) {
      scores[h * n + (j - j0)] = dot(qg + h * hd, r, hd) * scale;
    }
  }
  for (int64_t h = 0; h < G; ++h) {
    float* sc = &scores[h * n];
    float mx = sc[0];
    for (int64_t j = 1; j < n; ++j) mx = std::max(mx, sc[j]);
    float sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      sc[j] = std::exp(sc[j] - mx);
      sum += sc[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) sc[j] *= inv;
    std::memset(og + h * hd, 0, static_cast<size_t>(hd) * 4);
  }
  for (int64_t j = j0; j < n_ctx; ++j) {
    int64_t blk = table[j / bs], slot = j % bs;
    load_head(kv.v_row(layer, blk, slot), fp8 ? kv.v_scales(layer, blk, slot) : nullptr, dt, g, hd, r);
    for (int64_t h = 0; h < G; ++h) {
      const float p = scores[h * n + (j - j0)];
      float* oh = og + h * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] += p * r[i];
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void attend_avx512(
    const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g, const GqaShape& s,
    const float* q, float* out) {
  attend_impl(kv, layer, seq, n_ctx, g, s, q, out);
}

__attribute__((target("avx2,fma"))) void attend_avx2(const PagedKvCache& kv, int64_t layer, int64_t seq,
                                                     int64_t n_ctx, int64_t g, const GqaShape& s,
                                                     const float* q, float* out) {
  attend_impl(kv, layer, seq, n_ctx, g, s, q, out);
}

void attend_portable(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                     const GqaShape& s, const float* q, float* out) {
  attend_impl(kv, layer, seq, n_ctx, g, s, q, out);
}

}  // namespace

void gqa_attend_one(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                    const GqaShape& s, const float* q, float* out) {
  static const auto impl = [] {
    const CpuFeatures& f = cpu_features();
    if (f.avx512f && f.avx512bw && f.avx512vl) return &attend_avx512;
    if (f.avx2 && f.fma) return &attend_avx2;
    return &attend_portable;
  }();
  impl(kv, layer, seq, n_ctx, g, s, q, out);
}

}  // namespace afd
