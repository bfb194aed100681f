// Internal: exp over 16 float lanes for the AVX-512 kernels (included by their .cpp files,
// which compile it with their AVX-512 target attributes).
#pragma once

#include <immintrin.h>

namespace afd::kernels::detail {

// exp(x) for float lanes: x = k*ln2 + r, |r| <= ln2/2, degree-6 polynomial (Cephes expf
// coefficients), 2^k applied with scalef. Relative error about 2 ulp over the clamped range;
// inputs below -87.3 give ~0 (not denormals), above 88.7 give ~3.4e38.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"), always_inline)) inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, k);
}

}  // namespace afd::kernels::detail
