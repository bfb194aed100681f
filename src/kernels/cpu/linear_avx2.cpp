// AVX2 + FMA row-range kernels for linear(): the portable fast path for CPUs without
// AVX-512 (and what AFD_CPU_DISABLE=avx512 exercises).
//   * one token: the thread's row range read as 4 long sequential streams (rows_seq);
//   * more tokens: "dot" tiles of 3 rows of W x up to 4 tokens (12 accumulators, 3 widened W
//     vectors and one x vector: 16 registers), horizontal reduction per output; the 3 rows come
//     from the three thirds of the thread's range, so it too reads long sequential streams.
// Columns beyond the last multiple of 8 are summed by a scalar tail.
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
      float s = hsum(a[r][t]);
      for (int64_t c = cmain; c < cols; ++c) s += load1(w + rows[r] * cols + c) * x[t * ldx + c];
      float* o = y + t * ldy + rows[r];
      *o = acc ? *o + s : s;
    }
  }
}

// One token, S rows at once: y[s] = w[s] . x over cols for S rows that lie far apart (one in
// each S-th of the caller's row range), each read front to back, so a thread's range is read as
// S long sequential streams: enough memory-level parallelism to reach the read bandwidth, and
// streams long enough for the hardware prefetchers even when rows are short (interleaving
// consecutive rows would make each stream one short row).
template <int S, typename WT>
AFD_AVX2 void rows_seq(const WT* const* w, int64_t cols, const float* x, float* const* y, bool acc) {
  __m256 a[S][2];
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s) a[s][0] = a[s][1] = _mm256_setzero_ps();
  const int64_t cmain = cols & ~int64_t{15};
  int64_t c = 0;
  for (; c < cmain; c += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) {
      a[s][0] = _mm256_fmadd_ps(load8(w[s] + c), x0, a[s][0]);
      a[s][1] = _mm256_fmadd_ps(load8(w[s] + c + 8), x1, a[s][1]);
    }
  }
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s) {
    int64_t cc = c;
    __m256 v = _mm256_add_ps(a[s][0], a[s][1]);
    for (; cc + 8 <= cols; cc += 8) v = _mm256_fmadd_ps(load8(w[s] + cc), _mm256_loadu_ps(x + cc), v);
    float sum = hsum(v);
    for (; cc < cols; ++cc) sum += load1(w[s] + cc) * x[cc];
    *y[s] = acc ? *y[s] + sum : sum;
  }
}

// The stream partition of a thread's rows [r0, r1): calls f(S, rows) for sets of S row indices,
// one from each S-th of the range (set j: r0 + j, r0 + q + j, ..., q = (r1 - r0) / S), so the
// sets read the range as S sequential streams; then f(1, &r) for each row left over.
template <int S, class F>
inline void stream_sets(int64_t r0, int64_t r1, F&& f) {
  const int64_t q = (r1 - r0) / S;  // rows per stream
  for (int64_t j = 0; j < q; ++j) {
    int64_t rows[S];
    for (int s = 0; s < S; ++s) rows[s] = r0 + s * q + j;
    f(S, rows);
  }
  for (int64_t r = r0 + S * q; r < r1; ++r) f(1, &r);
}

// One token over rows [r0, r1): 4 sequential streams (rows_seq).
template <typename WT>
AFD_AVX2 void gemv_rows(const float* x, const WT* w, int64_t cols, int64_t r0, int64_t r1, float* y, bool acc) {
  constexpr int kStreams = 4;
  stream_sets<kStreams>(r0, r1, [&](int rn, const int64_t* rows) {
    const WT* rw[kStreams];
    float* outs[kStreams];
    for (int s = 0; s < rn; ++s) {
      rw[s] = w + rows[s] * cols;
      outs[s] = y + rows[s];
    }
    if (rn == kStreams)
      rows_seq<kStreams>(rw, cols, x, outs, acc);
    else
      rows_seq<1>(rw, cols, x, outs, acc);
  });
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

// Several tokens over rows [r0, r1): tiles of R rows from stream_sets (R sequential streams, as
// gemv_rows), token blocks of <= TMax inside each row set while its rows are in L1.
template <typename WT>
AFD_AVX2 void rows_generic(const float* x, int64_t n, int64_t ldx, const WT* w, int64_t cols, int64_t r0,
                           int64_t r1, float* y, int64_t ldy, bool acc) {
  if (n == 1) return gemv_rows(x, w, cols, r0, r1, y, acc);
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
