// Horizontal sums of the SIMD kernels' canonical orders (linear_kernels.h, linear_fp8_kernels.h):
// one tree per vector width, so every kernel that promises an order reduces its lanes the same
// way. Included by .cpp files whose functions carry the matching target attributes.
#pragma once

#include <immintrin.h>

namespace afd::kernels::detail {

// hsum8(v) = ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), lanes l0..l7 of v.
__attribute__((target("avx2"), always_inline)) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// hsum16(v) = (S0 + S2) + (S1 + S3) with S_k = (l[4k] + l[4k+2]) + (l[4k+1] + l[4k+3]), lanes
// l0..l15 of v: the tree of linear()'s reduce4 (linear_avx512.cpp), one vector at a time.
__attribute__((target("avx512f"), always_inline)) inline float hsum16(__m512 v) {
  const __m512 t = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));  // l[4k] + l[4k+2], ...
  const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));  // S_k in lane 4k
  const __m512 z = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, _MM_SHUFFLE(1, 0, 3, 2)));  // S0+S2, S1+S3
  return _mm_cvtss_f32(_mm_add_ss(_mm512_castps512_ps128(z), _mm512_extractf32x4_ps(z, 1)));
}

}  // namespace afd::kernels::detail
