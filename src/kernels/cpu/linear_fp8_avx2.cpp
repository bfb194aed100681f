// AVX2 + FMA + F16C kernels for linear_fp8() (see linear_fp8_kernels.h): the portable fast
// path for CPUs without AVX-512. e4m3 -> f32 goes through IEEE half exactly, as in the
// AVX-512 file (linear_fp8_avx512.cpp explains the bit layout); the 2^8 it leaves is folded
// into the block scale. A partial last group of 8 columns is copied to a zeroed buffer first,
// so W is never read past its end.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/linear_fp8_kernels.h"

#define AFD_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace afd::kernels::detail {

namespace {

constexpr int kMaxT = 4;

// 8 e4m3 bytes at p -> 8 floats, each 2^-8 times its value.
AFD_AVX2 inline __m256 cvt8(const uint8_t* p) {
  __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(static_cast<int16_t>(0xBFFF)));
  return _mm256_cvtph_ps(h);
}
// 16 e4m3 bytes at p -> 16 floats (2^-8 times their values) in two vectors: one widening and
// one shift/mask on 16 lanes, then two half conversions.
AFD_AVX2 inline void cvt16(const uint8_t* p, __m256* lo, __m256* hi) {
  __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}
AFD_AVX2 inline __m256 cvt8_tail(const uint8_t* p, int64_t m) {
  alignas(16) uint8_t b[16] = {};
  std::memcpy(b, p, static_cast<size_t>(std::min<int64_t>(m, 8)));
  return cvt8(b);
}

AFD_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int T>
AFD_AVX2 void gemv_row(const uint8_t* w, const float* srow, int64_t cols, const float* x, int64_t ldx, float* y,
                       int64_t ldy, bool acc) {
  __m256 a[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) a[t] = _mm256_setzero_ps();
  const int64_t nb = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t c0 = b * kFp8Block, bc = std::min<int64_t>(kFp8Block, cols - c0);
    __m256 p0[T], p1[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) p0[t] = p1[t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= bc; k += 16) {
      __m256 w0, w1;
      cvt16(w + c0 + k, &w0, &w1);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const float* xt = x + t * ldx + c0 + k;
        p0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), p0[t]);
        p1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), p1[t]);
      }
    }
    for (; k < bc; k += 8) {
      const __m256 w0 = bc - k >= 8 ? cvt8(w + c0 + k) : cvt8_tail(w + c0 + k, bc - k);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) p0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c0 + k), p0[t]);
    }
    const __m256 s = _mm256_set1_ps(srow[b] * 256.0f);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) a[t] = _mm256_fmadd_ps(_mm256_add_ps(p0[t], p1[t]), s, a[t]);
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const float v = hsum(a[t]);
    float* o = y + t * ldy;
    *o = acc ? *o + v : v;
  }
}

inline const float* scale_row(const Fp8BlockWeights& w, int64_t r) {
  return w.scale + (r + w.row_offset) / kFp8Block * w.scale_stride;
}

}  // namespace

AFD_AVX2 void fp8_gemv_avx2(const float* xf, int64_t n, int64_t ldx, const Fp8BlockWeights& w, int64_t cols,
                            int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.q + r * cols;
    const float* sr = scale_row(w, r);
    for (int64_t i = 0; i < n; i += kMaxT) {
      const float* xi = xf + i * ldx;
      float* yi = y + i * ldy + r;
      switch (std::min<int64_t>(kMaxT, n - i)) {
        case 1: gemv_row<1>(wr, sr, cols, xi, ldx, yi, ldy, acc); break;
        case 2: gemv_row<2>(wr, sr, cols, xi, ldx, yi, ldy, acc); break;
        case 3: gemv_row<3>(wr, sr, cols, xi, ldx, yi, ldy, acc); break;
        default: gemv_row<4>(wr, sr, cols, xi, ldx, yi, ldy, acc); break;
      }
    }
  }
}

AFD_AVX2 void fp8_dequant_rows_f32_avx2(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.q + r * cols;
    const float* sr = scale_row(w, r);
    float* o = out + (r - r0) * cols;
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __m256 s = _mm256_set1_ps(sr[c / kFp8Block] * 256.0f);
      __m256 lo, hi;
      cvt16(q + c, &lo, &hi);
      _mm256_storeu_ps(o + c, _mm256_mul_ps(lo, s));
      _mm256_storeu_ps(o + c + 8, _mm256_mul_ps(hi, s));
    }
    for (; c + 8 <= cols; c += 8)
      _mm256_storeu_ps(o + c, _mm256_mul_ps(cvt8(q + c), _mm256_set1_ps(sr[c / kFp8Block] * 256.0f)));
    if (c < cols) {
      alignas(32) float t[8];
      _mm256_store_ps(t, _mm256_mul_ps(cvt8_tail(q + c, cols - c), _mm256_set1_ps(sr[c / kFp8Block] * 256.0f)));
      std::memcpy(o + c, t, static_cast<size_t>(cols - c) * sizeof(float));
    }
  }
}

}  // namespace afd::kernels::detail
