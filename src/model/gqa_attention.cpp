#include "model/gqa_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define AFD_ALWAYS_INLINE inline __attribute__((always_inline))

namespace afd {

namespace {

// Converts slot `slot` of a (block, kv head) run to f32. head: the run's first element;
// scales: the run's fp8 scales (one per slot).
AFD_ALWAYS_INLINE void load_head(const uint8_t* head, const float* scales, DType dt, int64_t slot, int64_t hd,
                                 float* out) {
  if (dt == DType::bf16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(head) + slot * hd;
    for (int64_t i = 0; i < hd; ++i) out[i] = f32_from_bits(static_cast<uint32_t>(p[i]) << 16);
  } else if (dt == DType::f32) {
    std::memcpy(out, reinterpret_cast<const float*>(head) + slot * hd, static_cast<size_t>(hd) * 4);
  } else {
    const uint8_t* p = head + slot * hd;
    const float s = scales[slot];
    for (int64_t i = 0; i < hd; ++i) out[i] = fp8_e4m3_to_f32(p[i]) * s;
  }
}

AFD_ALWAYS_INLINE void attend_impl(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                                   const GqaShape& s, const float* q, float* out) {
  const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads, bs = kv.config().block_size;
  const DType dt = kv.config().dtype;
  const bool fp8 = dt == DType::f8_e4m3;
  const auto& table = kv.block_table(seq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  thread_local std::vector<float> scores, row, kt, krows;
  scores.resize(static_cast<size_t>(G * n_ctx));  // [G, n_ctx - j0] used
  row.resize(static_cast<size_t>(hd));
  float* r = row.data();
  const float* qg = q + g * G * hd;
  float* og = out + g * G * hd;
  // Sliding window: only the last s.window positions (HF Mixtral semantics).
  const int64_t j0 = (s.window > 0 && n_ctx > s.window) ? n_ctx - s.window : 0;

  const int64_t n = n_ctx - j0;
  // Scores in blocks of 16 positions: the block's K head rows are widened to f32 and
  // transposed to kt [hd][16], so each head's 16 scores are hd broadcast-FMAs with no
  // horizontal reductions (the block is shared by the G query heads of the group).
  constexpr int64_t kB = 16;
  kt.resize(static_cast<size_t>(hd * kB));
  krows.resize(static_cast<size_t>(hd * kB));
  for (int64_t jb = j0; jb < n_ctx; jb += kB) {
    const int64_t nb = std::min(kB, n_ctx - jb);
    for (int64_t t = 0; t < nb; ++t) {
      const int64_t j = jb + t;
      const int64_t blk = table[j / bs], slot = j % bs;
      load_head(kv.k_head(layer, blk, g), fp8 ? kv.k_scales(layer, blk, g) : nullptr, dt, slot, hd,
                &krows[t * hd]);
    }
    for (int64_t t = nb; t < kB; ++t) std::memset(&krows[t * hd], 0, static_cast<size_t>(hd) * 4);
    for (int64_t i = 0; i < hd; ++i)
      for (int64_t t = 0; t < kB; ++t) kt[i * kB + t] = krows[t * hd + i];
    for (int64_t h = 0; h < G; ++h) {
      const float* qh = qg + h * hd;
      float acc[kB] = {0};
      for (int64_t i = 0; i < hd; ++i) {
        const float qi = qh[i];
        for (int64_t t = 0; t < kB; ++t) acc[t] += qi * kt[i * kB + t];
      }
      for (int64_t t = 0; t < nb; ++t) scores[h * n + (jb + t - j0)] = acc[t] * scale;
    }
  }
  for (int64_t h = 0; h < G; ++h) {
    kernels::softmax(&scores[h * n], n);
    std::memset(og + h * hd, 0, static_cast<size_t>(hd) * 4);
  }
  for (int64_t j = j0; j < n_ctx; ++j) {
    int64_t blk = table[j / bs], slot = j % bs;
    load_head(kv.v_head(layer, blk, g), fp8 ? kv.v_scales(layer, blk, g) : nullptr, dt, slot, hd, r);
    for (int64_t h = 0; h < G; ++h) {
      const float p = scores[h * n + (j - j0)];
      float* oh = og + h * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] += p * r[i];
    }
  }
}

// 16 KV elements (bf16 or f32) widened to f32.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"), always_inline)) inline __m512 load16(
    const uint8_t* p, int64_t v, bool bf16) {
  if (bf16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + 16 * v);
}

// Scores of the G heads against positions [j0, n_ctx): each K row is widened once into NV
// registers and reused by every head of the group.
template <int NV, class RowPtr>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"), always_inline)) inline void scores_avx512(
    const float* qg, int64_t G, int64_t j0, int64_t n_ctx, int64_t n, float scale, bool bf16, const RowPtr& row_ptr,
    float* scores) {
  for (int64_t j = j0; j < n_ctx; ++j) {
    const uint8_t* kp = row_ptr(true, j);
    __m512 kr[NV];
    for (int v = 0; v < NV; ++v) kr[v] = load16(kp, v, bf16);
    for (int64_t h = 0; h < G; ++h) {
      const float* qh = qg + h * NV * 16;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qh), kr[0]);
      for (int v = 1; v < NV; ++v) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * v), kr[v], acc);
      scores[h * n + (j - j0)] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
}

// AVX-512 path for bf16 / f32 KV and head_dim % 16 == 0: each K row of the group is widened
// once into registers and dotted with the G query heads; V rows are accumulated into the
// G output heads in L1. No horizontal work except one reduce per (position, head).
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void attend_avx512_bf16_f32(
    const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g, const GqaShape& s,
    const float* q, float* out) {
  const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads, bs = kv.config().block_size;
  const bool bf16 = kv.config().dtype == DType::bf16;
  const auto& table = kv.block_table(seq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t j0 = (s.window > 0 && n_ctx > s.window) ? n_ctx - s.window : 0;
  const int64_t n = n_ctx - j0, nv = hd / 16;
  thread_local std::vector<float> scores;
  scores.resize(static_cast<size_t>(G * n));
  const float* qg = q + g * G * hd;
  float* og = out + g * G * hd;
  const size_t esz = bf16 ? 2 : 4;
  auto row_ptr = [&](bool is_k, int64_t j) {
    const int64_t blk = table[j / bs], slot = j % bs;
    return (is_k ? kv.k_head(layer, blk, g) : kv.v_head(layer, blk, g)) + slot * hd * esz;
  };
  if (nv == 8) {
    scores_avx512<8>(qg, G, j0, n_ctx, n, scale, bf16, row_ptr, scores.data());
  } else if (nv == 4) {
    scores_avx512<4>(qg, G, j0, n_ctx, n, scale, bf16, row_ptr, scores.data());
  } else {
    for (int64_t j = j0; j < n_ctx; ++j) {
      const uint8_t* kp = row_ptr(true, j);
      for (int64_t h = 0; h < G; ++h) {
        const float* qh = qg + h * hd;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t v = 0; v < nv; ++v) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * v), load16(kp, v, bf16), acc);
        scores[h * n + (j - j0)] = _mm512_reduce_add_ps(acc) * scale;
      }
    }
  }
  for (int64_t h = 0; h < G; ++h) {
    kernels::softmax(&scores[h * n], n);
    std::memset(og + h * hd, 0, static_cast<size_t>(hd) * 4);
  }
  for (int64_t j = j0; j < n_ctx; ++j) {
    const uint8_t* vp = row_ptr(false, j);
    for (int64_t v = 0; v < nv; ++v) {
      const __m512 x = load16(vp, v, bf16);
      for (int64_t h = 0; h < G; ++h) {
        float* o = og + h * hd + 16 * v;
        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(scores[h * n + (j - j0)]), x, _mm512_loadu_ps(o)));
      }
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
  static const bool avx512 = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx512f && f.avx512bw && f.avx512vl;
  }();
  const DType dt = kv.config().dtype;
  if (avx512 && s.head_dim % 16 == 0 && (dt == DType::bf16 || dt == DType::f32)) {
    attend_avx512_bf16_f32(kv, layer, seq, n_ctx, g, s, q, out);
    return;
  }
  impl(kv, layer, seq, n_ctx, g, s, q, out);
}

}  // namespace afd
