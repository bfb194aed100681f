// The horizontal sum of the AVX2 kernels' canonical order (linear_kernels.h): one tree, so
// every kernel that promises that order reduces its 8 lanes the same way.
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

}  // namespace afd::kernels::detail
