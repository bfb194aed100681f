// Internal: the AVX-512 score step of the tiled GQA decode kernel (gqa_attention_avx512.cpp,
// score16 over key rows) and of the blocked causal prefill kernel in CausalOrder::decode
// (causal_attention_avx512.cpp, score64_t over transposed keys): both compute every score with
// the same f32 operations (the canonical order stated in gqa_attention.h). Include only from
// translation units that call it from functions compiled for AVX-512 F/BW/VL/DQ.
#pragma once

// GCC 12 reports false -Wmaybe-uninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593), as in elementwise_avx512.cpp.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

namespace afd::kernels::detail {

#define AFD_SCORE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"), always_inline)) inline

// Sums of 16 vectors: lane t of the result = sum of the 16 lanes of a[t]. Pairs are combined
// with 32-bit unpacks, then 64-bit unpacks (each 128-bit lane k now holds the lane-k partial
// sums of 4 consecutive vectors), then two rounds of 128-bit lane shuffles. For every t the
// grouping is the same: with Q_k = (a[t][4k] + a[t][4k+2]) + (a[t][4k+1] + a[t][4k+3]),
// lane t = (Q_0 + Q_1) + (Q_2 + Q_3), whichever slot t the vector occupies.
AFD_SCORE_AVX512 __m512 reduce16(const __m512* a) {
  __m512 s2[8], s4[4];
  for (int i = 0; i < 8; ++i)
    s2[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(s2[2 * i]), y = _mm512_castps_pd(s2[2 * i + 1]);
    s4[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(s4[0], s4[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(s4[0], s4[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(s4[2], s4[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(s4[2], s4[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Lane t = scale * q . K_t for the 16 f32 key rows K_t = K + t * k_stride (hd % 16 == 0):
// per row, 16 lane accumulators acc[l] = fma(q[16v + l], K_t[16v + l], acc[l]) over the chunks
// v = 0 .. hd/16 - 1 in order, starting from +0; then reduce16; then one multiply by scale.
AFD_SCORE_AVX512 __m512 score16(const float* q, const float* K, int64_t k_stride, int64_t hd, __m512 scale) {
  __m512 acc[16];
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t v = 0; v < hd / 16; ++v) {
    const __m512 qv = _mm512_loadu_ps(q + 16 * v);
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(K + t * k_stride + 16 * v), acc[t]);
  }
  return _mm512_mul_ps(reduce16(acc), scale);
}

// The same scores for 64 positions at once from transposed keys: lane t of out[b] = scale *
// q . K_(16b + t), K_j[d] = kt[d * kt_stride + j] (b < 4). Bit-identical to score16 of each
// 16 positions: score16's lane accumulators acc[l] are here the vectors P_l (one lane per
// position), each the same fma chain over v = 0 .. hd/16 - 1, and reduce16's tree is applied
// to them vertically, Q_k = (P_4k + P_4k+2) + (P_4k+1 + P_4k+3), (Q_0 + Q_1) + (Q_2 + Q_3). One
// group of four l at a time keeps 16 accumulators (4 l x 4 position vectors); each broadcast
// q value feeds 4 FMAs.
AFD_SCORE_AVX512 void score64_t(const float* q, const float* kt, int64_t kt_stride, int64_t hd, __m512 scale,
                                __m512* out) {
  __m512 r01[4], r23[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    __m512 p[4][4];
    for (int i = 0; i < 4; ++i)
      for (int b = 0; b < 4; ++b) p[i][b] = _mm512_setzero_ps();
    for (int64_t v = 0; v < hd / 16; ++v) {
      for (int i = 0; i < 4; ++i) {
        const int64_t d = 16 * v + 4 * k + i;
        const __m512 qd = _mm512_set1_ps(q[d]);
        const float* kd = kt + d * kt_stride;
        for (int b = 0; b < 4; ++b) p[i][b] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(kd + 16 * b), p[i][b]);
      }
    }
    for (int b = 0; b < 4; ++b) {
      const __m512 qk = _mm512_add_ps(_mm512_add_ps(p[0][b], p[2][b]), _mm512_add_ps(p[1][b], p[3][b]));
      if (k == 0) r01[b] = qk;
      else if (k == 1) r01[b] = _mm512_add_ps(r01[b], qk);
      else if (k == 2) r23[b] = qk;
      else r23[b] = _mm512_add_ps(r23[b], qk);
    }
  }
  for (int b = 0; b < 4; ++b) out[b] = _mm512_mul_ps(_mm512_add_ps(r01[b], r23[b]), scale);
}

#undef AFD_SCORE_AVX512

}  // namespace afd::kernels::detail
