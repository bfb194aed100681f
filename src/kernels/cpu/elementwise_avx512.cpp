// AVX-512 element-wise kernels. Masked loads/stores handle the tails, so every length works.
// GCC 12 reports false -Wuninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/elementwise_kernels.h"
#include "kernels/cpu/exp_avx512.h"

#define AFD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

namespace afd::kernels::detail {

namespace {

AFD_AVX512 inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

}  // namespace

AFD_AVX512 void rmsnorm_avx512(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * dim;
    float* yi = y + i * dim;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= dim; c += 32) {
      __m512 a = _mm512_loadu_ps(xi + c), b = _mm512_loadu_ps(xi + c + 16);
      s0 = _mm512_fmadd_ps(a, a, s0);
      s1 = _mm512_fmadd_ps(b, b, s1);
    }
    for (; c < dim; c += 16) {
      __m512 a = _mm512_maskz_loadu_ps(tail_mask(dim - c), xi + c);
      s0 = _mm512_fmadd_ps(a, a, s0);
    }
    double ss = static_cast<double>(_mm512_reduce_add_ps(_mm512_add_ps(s0, s1)));
    __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps)));
    for (c = 0; c < dim; c += 16) {
      __mmask16 m = tail_mask(dim - c);
      __m512 a = _mm512_maskz_loadu_ps(m, xi + c);
      __m512 g = _mm512_maskz_loadu_ps(m, w + c);
      _mm512_mask_storeu_ps(yi + c, m, _mm512_mul_ps(_mm512_mul_ps(a, inv), g));
    }
  }
}

AFD_AVX512 void silu_mul_avx512(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, u));
  }
}

AFD_AVX512 void softmax_avx512(float* x, int64_t n) {
  if (n <= 0) return;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, x + i));
  }
  __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm));
    e = _mm512_maskz_mov_ps(m, e);
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / static_cast<double>(_mm512_reduce_add_ps(sum))));
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
}

AFD_AVX512 float scale_max_avx512(float* x, int64_t n, float s) {
  const __m512 vs = _mm512_set1_ps(s);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs);
    _mm512_mask_storeu_ps(x + i, m, v);
    mx = _mm512_mask_max_ps(mx, m, mx, v);
  }
  return _mm512_reduce_max_ps(mx);
}

AFD_AVX512 float exp_sub_sum_avx512(float* x, int64_t n, float mx) {
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm)));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// fp-contract=off: GCC would otherwise fuse the mul and add below into an FMA (C++ mode).
AFD_AVX512 __attribute__((optimize("fp-contract=off"))) void axpy_avx512(float a, const float* x, int64_t n,
                                                                        float* y) {
  // mul then add (no FMA): bit-identical to the scalar reference.
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i)));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

AFD_AVX512 void f32_to_bf16_row_avx512(const float* x, int64_t n, uint16_t* y) {
  // Same integer rounding as core/dtype.h f32_to_bf16 (nearest even; NaN stays NaN, quiet bit set),
  // not vcvtneps2bf16, which flushes denormal inputs to zero.
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i qnan = _mm512_set1_epi32(0x40);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + i));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), qnan));
    _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtepi32_epi16(r));
  }
}

AFD_AVX512 void bf16_to_f32_row_avx512(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + i));
    _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
  }
}

AFD_AVX512 float amax_avx512(const float* x, int64_t n) {
  __m512 mx = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail_mask(n - i);
    mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + i)));
  }
  return _mm512_reduce_max_ps(mx);
}

AFD_AVX512 void dequantize_fp8_avx512(const uint8_t* q, float scale, int64_t n, float* x) {
  // Decoded from the bits (core/dtype.cpp's table, without a gather): exponent field 0 is the
  // subnormal grid m * 2^-9, 0x7f / 0xff is NaN, else (e << 3 | m) << 20 plus the rebias
  // (120 << 23) is the f32 with the same value; the sign moves to bit 31.
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i low7 = _mm512_set1_epi32(0x7f), rebias = _mm512_set1_epi32(120 << 23);
  const __m512i nan = _mm512_set1_epi32(0x7fc00000), eight = _mm512_set1_epi32(8);
  const __m512 sub_unit = _mm512_set1_ps(1.0f / 512.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, q + i));
    const __m512i em = _mm512_and_si512(v, low7);
    __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(em, 20), rebias);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmplt_epi32_mask(em, eight),
                                 _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(em), sub_unit)));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(em, low7), nan);
    bits = _mm512_or_si512(bits, _mm512_slli_epi32(_mm512_xor_si512(v, em), 24));  // sign: bit 7 -> 31
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_castsi512_ps(bits), s));
  }
}

namespace {

// q[i] = f32_to_fp8_e4m3(x[i] / s) (kDivide) or f32_to_fp8_e4m3(x[i] * s).
template <bool kDivide>
AFD_AVX512 inline void quantize_fp8_impl(const float* x, float scale, int64_t n, uint8_t* q) {
  // core/dtype.h f32_to_fp8_e4m3, lane-wise on the bits of x[i] / scale (a vector division
  // rounds exactly as the scalar one): NaN -> 0x7f, |y| >= 448 -> 0x7e (saturate), |y| < 2^-6
  // -> the subnormal grid round(|y| * 2^9) (0..8; 8 is 2^-6's code), else the mantissa
  // rounded to 3 bits, nearest even, and the exponent rebiased (127 -> 7); the sign on top.
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf_bits = _mm512_set1_epi32(0x7f800000);
  const __m512i max_bits = _mm512_set1_epi32(0x43e00000);  // 448.0f
  const __m512i min_normal_bits = _mm512_set1_epi32(0x3c800000);  // 2^-6
  const __m512i one = _mm512_set1_epi32(1), round_bias = _mm512_set1_epi32(0x7ffff);
  const __m512i rebias = _mm512_set1_epi32(120 << 3);
  const __m512i sat = _mm512_set1_epi32(0x7e), nan = _mm512_set1_epi32(0x7f);
  const __m512 sub_scale = _mm512_set1_ps(512.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
    const __m512i u = _mm512_castps_si512(kDivide ? _mm512_div_ps(xv, s) : _mm512_mul_ps(xv, s));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    const __m512i a = _mm512_and_si512(u, abs_mask);
    // Normal: round at bit 20, then (biased exponent << 3 | mantissa) - (120 << 3); past 0x7e
    // (exponent 15 with mantissa 7, or more) saturates.
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, 20), one);
    const __m512i r = _mm512_add_epi32(a, _mm512_add_epi32(round_bias, odd));
    __m512i v = _mm512_min_epi32(_mm512_sub_epi32(_mm512_srli_epi32(r, 20), rebias), sat);
    // Subnormal grid (the conversion rounds to nearest even, as nearbyint in the default mode).
    const __m512i sub = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), sub_scale),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_mask_mov_epi32(v, _mm512_cmplt_epu32_mask(a, min_normal_bits), sub);
    v = _mm512_mask_mov_epi32(v, _mm512_cmpge_epu32_mask(a, max_bits), sat);
    v = _mm512_mask_mov_epi32(v, _mm512_cmpgt_epu32_mask(a, inf_bits), nan);
    _mm_mask_storeu_epi8(q + i, m, _mm512_cvtepi32_epi8(_mm512_or_si512(v, sign)));
  }
}

}  // namespace

AFD_AVX512 void quantize_fp8_avx512(const float* x, float scale, int64_t n, uint8_t* q) {
  quantize_fp8_impl<true>(x, scale, n, q);
}

AFD_AVX512 void scale_to_fp8_avx512(const float* x, float mul, int64_t n, uint8_t* q) {
  quantize_fp8_impl<false>(x, mul, n, q);
}

}  // namespace afd::kernels::detail
