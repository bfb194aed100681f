// Internal: exp over 8 float lanes for the AVX2 kernels (included by their .cpp files, which
// compile it with their AVX2 target attributes).
#pragma once

#include <immintrin.h>

namespace afd::kernels::detail {

// exp(x) for float lanes, the same range reduction and polynomial as exp_ps (exp_avx512.h):
// x = k*ln2 + r, |r| <= ln2/2, degree-6 polynomial (Cephes expf coefficients), 2^k built in
// the exponent bits. Relative error about 2 ulp over the clamped range; inputs below -87.3
// give ~0 (not denormals), above 88.3 give ~2^127.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp_ps_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // k in [-126, 127]: 2^k = (k + 127) << 23 as float bits.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace afd::kernels::detail
