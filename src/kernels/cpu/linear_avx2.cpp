// AVX2 + FMA row-range kernels for linear(): the portable fast path for CPUs without
// AVX-512 (and what AFD_CPU_DISABLE=avx512 exercises). Same "dot" tiling as the AVX-512 file:
// R rows of W x T tokens, W streamed once per token block, horizontal reduction per output.
// Columns beyond the last multiple of 8 are summed by a scalar tail. No software prefetch
// (as the AVX-512 kernels' default, see linear_avx512.cpp).
// GCC 12 reports false -Wuninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "core/dtype.h"
#include "kernels/cpu/linear_kernels.h"

#define AFD_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace afd::kernels::detail {

namespace {

AFD_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

AFD_AVX2 inline __m256 load8(const uint16_t* p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
AFD_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline float load1(const uint16_t* p) { return bf16_to_f32(*p); }
inline float load1(const float* p) { return *p; }

template <int R, int T, typename WT>
AFD_AVX2 void tile(const WT* w, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy,
                   bool acc) {
  __m256 a[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) a[r][t] = _mm256_setzero_ps();
  const int64_t cmain = cols & ~int64_t{7};
  for (int64_t c = 0; c < cmain; c += 8) {
    __m256 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const WT* p = w + r * cols + c;
      wv[r] = load8(p);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m256 xv = _mm256_loadu_ps(x + t * ldx + c);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float s = hsum(a[r][t]);
      for (int64_t c = cmain; c < cols; ++c) s += load1(w + r * cols + c) * x[t * ldx + c];
      float* o = y + t * ldy + r;
      *o = acc ? *o + s : s;
    }
  }
}

template <int R, typename WT>
AFD_AVX2 void run_tile(int t, const WT* w, int64_t cols, const float* x, int64_t ldx, float* y,
                       int64_t ldy, bool acc) {
  switch (t) {
    case 1: tile<R, 1>(w, cols, x, ldx, y, ldy, acc); break;
    case 2: tile<R, 2>(w, cols, x, ldx, y, ldy, acc); break;
    case 3: tile<R, 3>(w, cols, x, ldx, y, ldy, acc); break;
    default: break;
  }
}

template <typename WT>
AFD_AVX2 void rows_generic(const float* x, int64_t n, int64_t ldx, const WT* w, int64_t cols, int64_t r0,
                           int64_t r1, float* y, int64_t ldy, bool acc) {
  constexpr int R = 4;
  constexpr int TMax = 3;
  for (int64_t i0 = 0; i0 < n; i0 += kTokenChunk) {
    const int64_t nc = std::min(kTokenChunk, n - i0);
    const int64_t nb = (nc + TMax - 1) / TMax;
    for (int64_t r = r0; r < r1;) {
      const bool full = r + R <= r1;
      int64_t i = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const int t = static_cast<int>((nc - i) / (nb - b));
        const float* xb = x + (i0 + i) * ldx;
        float* yb = y + (i0 + i) * ldy + r;
        if (full)
          run_tile<R>(t, w + r * cols, cols, xb, ldx, yb, ldy, acc);
        else
          run_tile<1>(t, w + r * cols, cols, xb, ldx, yb, ldy, acc);
        i += t;
      }
      r += full ? R : 1;
    }
  }
}

}  // namespace

AFD_AVX2 void rows_fma_bf16w_avx2(const float* x, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols,
                                  int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc) {
  rows_generic(x, n, ldx, w, cols, r0, r1, y, ldy, acc);
}

AFD_AVX2 void rows_fma_f32w_avx2(const float* x, int64_t n, int64_t ldx, const float* w, int64_t cols,
                                 int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc) {
  rows_generic(x, n, ldx, w, cols, r0, r1, y, ldy, acc);
}

}  // namespace afd::kernels::detail
