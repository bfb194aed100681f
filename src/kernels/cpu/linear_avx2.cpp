// AVX2 + FMA row-range kernels for linear(): the portable fast path for CPUs without
// AVX-512 (and what AFD_CPU_DISABLE=avx512 exercises). Every output follows the AVX2 order of
// linear_kernels.h (one 8-lane accumulator, hsum8, scalar FMA tail), whatever the tile:
//   * one token: 4 rows at a time, one from each quarter of the thread's range, so the range is
//     read as 4 long sequential streams;
//   * more tokens: "dot" tiles of 3 rows of W x up to 4 tokens (12 accumulators, 3 widened W
//     vectors and one x vector: 16 registers), the 3 rows from the three thirds of the range.
// GCC 12 reports false -Wuninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "kernels/cpu/hsum.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/row_streams.h"

#define AFD_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace afd::kernels::detail {

namespace {

AFD_AVX2 inline __m256 load8(const uint16_t* p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
AFD_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline float load1(const uint16_t* p) { return bf16_to_f32(*p); }
inline float load1(const float* p) { return *p; }

// R rows of W (indices rows[0..R), anywhere in W) x T tokens: y[t * ldy + rows[r]] = W row . x row t.
template <int R, int T, typename WT>
AFD_AVX2 void tile(const WT* w, int64_t cols, const int64_t* rows, const float* x, int64_t ldx, float* y,
                   int64_t ldy, bool acc) {
  static_assert(R * T + R + 1 <= 16, "accumulators, W vectors and one x vector fit 16 registers");
  __m256 a[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) a[r][t] = _mm256_setzero_ps();
  const int64_t cmain = cols & ~int64_t{7};
  for (int64_t c = 0; c < cmain; c += 8) {
    __m256 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = load8(w + rows[r] * cols + c);
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
      float s = hsum8(a[r][t]);
      for (int64_t c = cmain; c < cols; ++c) s = std::fma(load1(w + rows[r] * cols + c), x[t * ldx + c], s);
      float* o = y + t * ldy + rows[r];
      *o = acc ? *o + s : s;
    }
  }
}

template <int R, typename WT>
AFD_AVX2 void run_tile(int t, const WT* w, int64_t cols, const int64_t* rows, const float* x, int64_t ldx, float* y,
                       int64_t ldy, bool acc) {
  switch (t) {
    case 1: tile<R, 1>(w, cols, rows, x, ldx, y, ldy, acc); break;
    case 2: tile<R, 2>(w, cols, rows, x, ldx, y, ldy, acc); break;
    case 3: tile<R, 3>(w, cols, rows, x, ldx, y, ldy, acc); break;
    case 4: tile<R, 4>(w, cols, rows, x, ldx, y, ldy, acc); break;
    default: break;
  }
}

// Rows [r0, r1): tiles of R rows from stream_sets (R sequential streams), token blocks of
// <= TMax inside each row set while its rows are in L1; one token: 4-row tiles.
template <typename WT>
AFD_AVX2 void rows_generic(const float* x, int64_t n, int64_t ldx, const WT* w, int64_t cols, int64_t r0,
                           int64_t r1, float* y, int64_t ldy, bool acc) {
  if (n == 1) {
    stream_sets<4>(r0, r1, [&](int rn, const int64_t* rows) {
      if (rn == 4) tile<4, 1>(w, cols, rows, x, ldx, y, ldy, acc);
      else tile<1, 1>(w, cols, rows, x, ldx, y, ldy, acc);
    });
    return;
  }
  constexpr int R = 3;
  constexpr int TMax = 4;
  for (int64_t i0 = 0; i0 < n; i0 += kTokenChunk) {
    const int64_t nc = std::min(kTokenChunk, n - i0);
    const int64_t nb = (nc + TMax - 1) / TMax;
    auto row_set = [&](int rn, const int64_t* rows) {
      int64_t i = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const int t = static_cast<int>((nc - i) / (nb - b));
        const float* xb = x + (i0 + i) * ldx;
        float* yb = y + (i0 + i) * ldy;
        if (rn == R)
          run_tile<R>(t, w, cols, rows, xb, ldx, yb, ldy, acc);
        else
          run_tile<1>(t, w, cols, rows, xb, ldx, yb, ldy, acc);
        i += t;
      }
    };
    stream_sets<R>(r0, r1, row_set);
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
