// AVX2 + FMA + F16C kernels for linear_fp8() (see linear_fp8_kernels.h): the portable fast
// path for CPUs without AVX-512. e4m3 -> f32 goes through IEEE half exactly, as in the
// AVX-512 file (linear_fp8_avx512.cpp explains the bit layout); the 2^8 it leaves is folded
// into the block scale, which the gemv and the tiles apply to x (linear_fp8_kernels.h). W is
// never read past its end: the gemv converts whole groups of 8 columns and the last cols % 8
// one by one, the dequantization copies them to a zeroed buffer.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/hsum.h"
#include "kernels/cpu/linear_fp8_kernels.h"
#include "kernels/cpu/row_streams.h"

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

// R rows (w[r]) of one scale row x T tokens of xs (x prescaled for that scale row,
// prescale_x_fp8); y[r] + t * ldy. Each output: the AVX2 order of linear_kernels.h on
// W[r, c] = fp8(q) * 2^-8 (exact) and xs: one 8-lane FMA chain over the whole 8-column groups,
// hsum8, then the last cols % 8 columns by scalar FMAs.
template <int R, int T>
AFD_AVX2 void gemv_tile(const uint8_t* const* w, int64_t cols, const float* x, int64_t ldx, float* const* y,
                        int64_t ldy, bool acc) {
  __m256 a[R][T];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) a[r][t] = _mm256_setzero_ps();
  const int64_t c8 = cols & ~int64_t{7};
  for (int64_t c0 = 0; c0 < c8; c0 += kFp8Block) {
    const int64_t c1 = std::min(c8, c0 + kFp8Block);
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        __m256 w0, w1;
        cvt16(w[r] + c, &w0, &w1);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          a[r][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c), a[r][t]);
          a[r][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + c + 8), a[r][t]);
        }
      }
    }
    if (c < c1) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 w0 = cvt8(w[r] + c);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) a[r][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c), a[r][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      float v = hsum8(a[r][t]);
      for (int64_t c = c8; c < cols; ++c) v = std::fma(fp8_e4m3_to_f32(w[r][c]) * 0x1p-8f, x[t * ldx + c], v);
      float* o = y[r] + t * ldy;
      *o = acc ? *o + v : v;
    }
}

// Rows [r0, r1) of one scale row, all n tokens (xs [n, ldx] prescaled for it): sets of R rows
// from R sequential streams (stream_sets), each set for the token blocks of <= kMaxT while its
// rows are in L1. No software prefetch: the hardware prefetchers follow 4 sequential streams (a
// prefetch 8 KiB ahead measured about 12 % slower at one token).
template <int R>
AFD_AVX2 void gemv_rows(const float* xs, int64_t n, int64_t ldx, const uint8_t* q, int64_t cols, int64_t r0,
                        int64_t r1, float* y, int64_t ldy, bool acc) {
  stream_sets<R>(r0, r1, [&](int rn, const int64_t* rows) {
    const uint8_t* wr[R];
    for (int k = 0; k < rn; ++k) wr[k] = q + rows[k] * cols;
    for (int64_t i = 0; i < n; i += kMaxT) {
      float* yr[R];
      for (int k = 0; k < rn; ++k) yr[k] = y + i * ldy + rows[k];
      const float* xi = xs + i * ldx;
      with_tile_shape<R>(rn, std::min<int64_t>(kMaxT, n - i), [&](auto rr, auto tt) {
        gemv_tile<decltype(rr)::value, decltype(tt)::value>(wr, cols, xi, ldx, yr, ldy, acc);
      });
    }
  });
}

// out = fp8 * 2^-8 * s for the rows' bytes, s = scale * 256 per column block (Scaled) or 1.
template <bool Scaled>
AFD_AVX2 inline __m256 times(__m256 v, const float* sr, int64_t c) {
  if constexpr (Scaled) return _mm256_mul_ps(v, _mm256_set1_ps(sr[c / kFp8Block] * 256.0f));
  return v;
}
template <bool Scaled>
AFD_AVX2 inline void convert_rows(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.q + r * cols;
    const float* sr = fp8_scale_row(w, r);
    float* o = out + (r - r0) * cols;
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      __m256 lo, hi;
      cvt16(q + c, &lo, &hi);
      _mm256_storeu_ps(o + c, times<Scaled>(lo, sr, c));
      _mm256_storeu_ps(o + c + 8, times<Scaled>(hi, sr, c));
    }
    for (; c + 8 <= cols; c += 8) _mm256_storeu_ps(o + c, times<Scaled>(cvt8(q + c), sr, c));
    if (c < cols) {
      alignas(32) float t[8];
      _mm256_store_ps(t, times<Scaled>(cvt8_tail(q + c, cols - c), sr, c));
      std::memcpy(o + c, t, static_cast<size_t>(cols - c) * sizeof(float));
    }
  }
}

}  // namespace

AFD_AVX2 void fp8_gemv_avx2(const float* xf, int64_t n, int64_t ldx, const Fp8BlockWeights& w, int64_t cols, int64_t r0,
                            int64_t r1, float* y, int64_t ldy, bool acc, ScratchSlot& scratch) {
  ScratchSlot::Frame frame(scratch);
  float* xs = scratch.take<float>(static_cast<size_t>(n * ldx));
  for (int64_t r = r0, re; r < r1; r = re) {
    re = fp8_scale_run_end(w, r, r1);
    prescale_x_fp8(xf, n, ldx, cols, fp8_scale_row(w, r), xs, ldx);
    // 4 rows at a time: independent FMA chains to cover the FMA latency.
    gemv_rows<4>(xs, n, ldx, w.q, cols, r, re, y, ldy, acc);
  }
}

AFD_AVX2 void fp8_dequant_rows_f32_avx2(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, float* out) {
  convert_rows<true>(w, cols, r0, r1, out);
}

AFD_AVX2 void fp8_rows_unscaled_f32_avx2(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1,
                                         float* out) {
  convert_rows<false>(w, cols, r0, r1, out);
}

}  // namespace afd::kernels::detail
