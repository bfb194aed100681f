// AVX-512 row-range kernels for linear(). Every function carries the target attribute, so
// this file adds no AVX-512 code to paths that run on other CPUs; linear.cpp calls these
// only when active_isa() == Isa::avx512.
//
// Tiles are R rows of W x T tokens in the "dot" layout: each W row is loaded as it lies in
// memory (row-major [rows, cols], no packing), each accumulator holds 16 partial sums of one
// (row, token) pair, reduced horizontally at the end of the row (bf16 x bf16: in the canonical
// order of linear_kernels.h, whatever the tile, token block or column block). W is the streamed
// operand: every W element is loaded once per token block, x comes from L1/L2.
// GCC 12 reports false -Wuninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/prefetch.h"

#define AFD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

namespace afd::kernels::detail {

namespace {

// Horizontal sums of four accumulators: lane j of the result is the sum of the 16 lanes of the
// j-th argument (13 instructions for four sums; _mm512_reduce_add_ps takes 8 for one).
AFD_AVX512 inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Per 128-bit block k: [a0+a2, b0+b2, a1+a3, b1+b3] (lane indices within the block), same for c, d.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // Per block k: the block's partial sums [a_k, b_k, c_k, d_k].
  // (unpack*_pd moves the 64-bit pairs; the sum is in f32.)
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// The sum of a's 16 lanes in reduce4's order (the canonical tree of linear_kernels.h), the same
// IEEE operations on the same operands as lane 0 of reduce4(a, b, c, d).
AFD_AVX512 inline float reduce1(__m512 a) {
  // Per 128-bit block: lane 0 = a0 + a2, lane 1 = a1 + a3; then lane 0 = (a0 + a2) + (a1 + a3).
  const __m512 p = _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 s = _mm512_add_ps(p, _mm512_permute_ps(p, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

// y[t * ldy + r] (+)= horizontal sum of a[r][t]. Tree: four sums at a time (reduce4).
template <int R, int T, bool Tree = false>
AFD_AVX512 inline void store_tile(__m512 (&a)[R][T], float* y, int64_t ldy, bool acc) {
  if constexpr (Tree) {
    // Sums in token-major order k = t * R + r.
    constexpr int N = R * T;
    alignas(16) float s[N + 3];
#pragma GCC unroll 16
    for (int k = 0; k + 4 <= N; k += 4)
      _mm_store_ps(s + k, reduce4(a[k % R][k / R], a[(k + 1) % R][(k + 1) / R], a[(k + 2) % R][(k + 2) / R],
                                  a[(k + 3) % R][(k + 3) / R]));
    // The last partial group through reduce4 as well, padded with zeros (exact): reduce4 sums
    // every argument's lanes in the same order, so each sum is independent of the tile shape
    // and the results do not depend on how rows are split over threads.
    if constexpr (N % 4 != 0) {
      constexpr int k = N / 4 * 4;
      const __m512 z = _mm512_setzero_ps();
      _mm_store_ps(s + k, reduce4(a[k % R][k / R], k + 1 < N ? a[(k + 1) % R][(k + 1) / R] : z,
                                  k + 2 < N ? a[(k + 2) % R][(k + 2) / R] : z, z));
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        float* o = y + t * ldy + r;
        *o = acc ? *o + s[t * R + r] : s[t * R + r];
      }
    }
    return;
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float s = _mm512_reduce_add_ps(a[r][t]);
      float* o = y + t * ldy + r;
      *o = acc ? *o + s : s;
    }
  }
}

// ---- bf16 x bf16 -> f32 (vdpbf16ps) ----
// One (row, token) accumulator per pair: lane j takes column pair 16 c + j of every 32-column
// chunk c, in ascending c, and the lanes are summed with reduce4 (the canonical order of
// linear_kernels.h). Rows of W are ldw elements apart (0: cols); pf: prefetch (to L1) the byte at
// this offset from every W load; pf_l2: the same towards L2 (_MM_HINT_T1).
// Column blocks: a call may cover columns [c0, c0 + cols) of longer rows (c0 a multiple of 32,
// w and x pointing at column c0) when part, R x T x 16 floats, carries the accumulators
// between the calls of one (rows, tokens) tile: part_in starts from part instead of zero,
// part_out leaves the accumulators in part instead of reducing them into y.
template <int R, int T>
AFD_AVX512 void tile_dp(const uint16_t* w, int64_t cols, const uint16_t* x, int64_t ldx, float* y, int64_t ldy,
                        bool acc, int64_t pf, int64_t ldw = 0, int64_t pf_l2 = 0, float* part = nullptr,
                        bool part_in = false, bool part_out = false) {
  const int64_t lw = ldw ? ldw : cols;
  __m512 a[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) a[r][t] = part_in ? _mm512_loadu_ps(part + 16 * (r * T + t)) : _mm512_setzero_ps();
  const int64_t cmain = cols & ~int64_t{31};
  int64_t c = 0;
  for (; c < cmain; c += 32) {
    __m512bh wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint16_t* p = w + r * lw + c;
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(p) + pf, _MM_HINT_T0);
      if (pf_l2) _mm_prefetch(reinterpret_cast<const char*>(p) + pf_l2, _MM_HINT_T1);
      wv[r] = (__m512bh)_mm512_loadu_si512(p);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + t * ldx + c);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_dpbf16_ps(a[r][t], wv[r], xv);
    }
  }
  if (c < cols) {
    // x is zero padded to a multiple of 32 columns; W must not be read past its end.
    __mmask32 m = _cvtu32_mask32((1u << (cols - c)) - 1u);
    __m512bh wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + r * lw + c);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + t * ldx + c);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_dpbf16_ps(a[r][t], wv[r], xv);
    }
  }
  if (part_out) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) _mm512_storeu_ps(part + 16 * (r * T + t), a[r][t]);
    return;
  }
  store_tile<R, T, true>(a, y, ldy, acc);
}

// ---- f32 x (bf16 W widened) -> f32 FMA; x permuted per 32-column block ----
template <int R, int T, bool Tree = false>
AFD_AVX512 void tile_fma_bf16w(const uint16_t* w, int64_t cols, const float* x, int64_t ldx, float* y,
                               int64_t ldy, bool acc, int64_t pf) {
  __m512 a[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  const int64_t cmain = cols & ~int64_t{31};
  int64_t c = 0;
  for (; c < cols; c += 32) {
    __m512 lo[R], hi[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint16_t* p = w + r * cols + c;
      __m512i wv;
      if (c < cmain) {
        if (pf) _mm_prefetch(reinterpret_cast<const char*>(p) + pf, _MM_HINT_T0);
        wv = _mm512_loadu_si512(p);
      } else {
        wv = _mm512_maskz_loadu_epi16(_cvtu32_mask32((1u << (cols - c)) - 1u), p);
      }
      // bf16 -> f32 is exact: the bf16 bits become the high half of each 32-bit lane.
      lo[r] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, wv));
      hi[r] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, wv));
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m512 x0 = _mm512_loadu_ps(x + t * ldx + c);
      __m512 x1 = _mm512_loadu_ps(x + t * ldx + c + 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        a[r][t] = _mm512_fmadd_ps(lo[r], x0, a[r][t]);
        a[r][t] = _mm512_fmadd_ps(hi[r], x1, a[r][t]);
      }
    }
  }
  store_tile<R, T, Tree>(a, y, ldy, acc);
}

// ---- f32 x f32 W -> f32 FMA ----
template <int R, int T, bool Tree = false>
AFD_AVX512 void tile_fma_f32w(const float* w, int64_t cols, const float* x, int64_t ldx, float* y,
                              int64_t ldy, bool acc, int64_t pf) {
  __m512 a[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_ps();
  const int64_t cmain = cols & ~int64_t{15};
  int64_t c = 0;
  for (; c < cmain; c += 16) {
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float* p = w + r * cols + c;
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(p) + pf, _MM_HINT_T0);
      wv[r] = _mm512_loadu_ps(p);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m512 xv = _mm512_loadu_ps(x + t * ldx + c);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
  if (c < cols) {
    __mmask16 m = _cvtu32_mask16((1u << (cols - c)) - 1u);
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(m, w + r * cols + c);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + t * ldx + c);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
  store_tile<R, T, Tree>(a, y, ldy, acc);
}

// ---- One to kRowSeqMaxN tokens, one row at a time ----
// Each W row is read front to back, so a thread's W range is one sequential stream, which
// reads at the machine's streaming bandwidth. rows_seq_dp has one accumulator per (row, token)
// (the canonical order of linear_kernels.h) and streams S parts of the rows side by side for
// independent chains (S long sequential streams), every W vector feeding the T tokens'
// accumulators of its row, so the W bytes per instruction and the memory-level parallelism of
// the T-token call are those of the one-token call. The f32-activation variants have 4
// accumulators on one row. Interleaving 4-8 rows (the tiles above) splits it into short strided
// streams that the hardware prefetchers follow badly when rows are short. With more tokens the
// tiles win (x reuse across rows and fewer reductions per W byte).
// x is zero padded to a multiple of 32 columns (and permuted per 32-column block for
// fma_bf16w, see prep_x_f32_perm32); W is read only up to cols. rows_seq_dp prefetches W pf
// bytes ahead (0: none) within the `left` bytes this call reads from w on; the f32-activation
// variants do not (docs/bench-log/2026-11-26-fp8-prefetch.md).
// T tokens: x rows ldx apart, y rows ldy apart (y[t * ldy + r]).
template <int S, int T>
AFD_AVX512 void rows_seq_dp(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t cols, int64_t r0, int64_t r1,
                            float* y, int64_t ldy, bool acc, int64_t pf) {
  static_assert(S * T + S + T <= 32, "accumulators, W and x vectors fit the 32 zmm registers");
  // Rows [r0, r1) as S contiguous parts of `per` rows, one row of each part at a time (S * T
  // accumulator chains, S sequential streams), then the remaining rows one by one.
  const int64_t per = (r1 - r0) / S;
  const int64_t c128 = cols & ~int64_t{127};
  for (int64_t i = 0; i < per; ++i) {
    const uint16_t* wr[S];
    __m512 a[S][T];
#pragma GCC unroll 4
    for (int p = 0; p < S; ++p) {
      wr[p] = w + (r0 + p * per + i) * cols;
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) a[p][t] = _mm512_setzero_ps();
    }
    const int64_t left = (per - i) * cols * 2;  // bytes from wr[p] to the end of part p
    int64_t c = 0;
    for (; c < c128; c += 128) {
#pragma GCC unroll 4
      for (int p = 0; p < S; ++p) prefetch_ahead<4>(wr[p] + c, pf, left - 2 * c);
#pragma GCC unroll 4
      for (int k = 0; k < 128; k += 32) {
        __m512bh xv[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x + t * ldx + c + k);
#pragma GCC unroll 4
        for (int p = 0; p < S; ++p) {
          const __m512bh wv = (__m512bh)_mm512_loadu_si512(wr[p] + c + k);
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t) a[p][t] = _mm512_dpbf16_ps(a[p][t], wv, xv[t]);
        }
      }
    }
    for (; c < cols; c += 32) {
      const __mmask32 m = cols - c >= 32 ? ~__mmask32{0} : _cvtu32_mask32((1u << (cols - c)) - 1u);
      __m512bh xv[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x + t * ldx + c);
#pragma GCC unroll 4
      for (int p = 0; p < S; ++p) {
        const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, wr[p] + c);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) a[p][t] = _mm512_dpbf16_ps(a[p][t], wv, xv[t]);
      }
    }
    // The S * T sums four at a time (reduce4; a last partial group padded with zeros), each in
    // the canonical tree whatever its group.
    constexpr int N = S * T;
    if constexpr (N == 1) {
      const float s = reduce1(a[0][0]);
      float* o = y + r0 + i;
      *o = acc ? *o + s : s;
    } else {
      const __m512 z = _mm512_setzero_ps();
      alignas(16) float sums[(N + 3) / 4 * 4];
#pragma GCC unroll 4
      for (int k = 0; k < N; k += 4)
        _mm_store_ps(sums + k,
                     reduce4(a[k % S][k / S], k + 1 < N ? a[(k + 1) % S][(k + 1) / S] : z,
                             k + 2 < N ? a[(k + 2) % S][(k + 2) / S] : z, k + 3 < N ? a[(k + 3) % S][(k + 3) / S] : z));
#pragma GCC unroll 16
      for (int k = 0; k < N; ++k) {
        float* o = y + (k / S) * ldy + r0 + (k % S) * per + i;
        *o = acc ? *o + sums[k] : sums[k];
      }
    }
  }
  if constexpr (S > 1) rows_seq_dp<1, T>(x, ldx, w, cols, r0 + S * per, r1, y, ldy, acc, pf);
}

// rows_seq_dp with T = n (1 <= n <= kRowSeqMaxN) and S = streams (1, 2 or 4).
template <int S>
AFD_AVX512 void rows_seq_dp_n(const uint16_t* x, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols, int64_t r0,
                              int64_t r1, float* y, int64_t ldy, bool acc, int64_t pf) {
  switch (n) {
    case 1: rows_seq_dp<S, 1>(x, ldx, w, cols, r0, r1, y, ldy, acc, pf); break;
    case 2: rows_seq_dp<S, 2>(x, ldx, w, cols, r0, r1, y, ldy, acc, pf); break;
    case 3: rows_seq_dp<S, 3>(x, ldx, w, cols, r0, r1, y, ldy, acc, pf); break;
    case 4: rows_seq_dp<S, 4>(x, ldx, w, cols, r0, r1, y, ldy, acc, pf); break;
    default: break;
  }
}

AFD_AVX512 void row_seq_fma_bf16w(const uint16_t* w, int64_t cols, const float* x, float* y, bool acc) {
  const __m512i zero = _mm512_setzero_si512();
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t c64 = cols & ~int64_t{63};
  int64_t c = 0;
  for (; c < c64; c += 64) {
    const __m512i w0 = _mm512_loadu_si512(w + c), w1 = _mm512_loadu_si512(w + c + 32);
    a0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w0)), _mm512_loadu_ps(x + c), a0);
    a1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w0)), _mm512_loadu_ps(x + c + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w1)), _mm512_loadu_ps(x + c + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w1)), _mm512_loadu_ps(x + c + 48), a3);
  }
  for (; c < cols; c += 32) {
    const __mmask32 m = cols - c >= 32 ? ~__mmask32{0} : _cvtu32_mask32((1u << (cols - c)) - 1u);
    const __m512i w0 = _mm512_maskz_loadu_epi16(m, w + c);
    a0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w0)), _mm512_loadu_ps(x + c), a0);
    a1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w0)), _mm512_loadu_ps(x + c + 16), a1);
  }
  const float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  *y = acc ? *y + s : s;
}

AFD_AVX512 void row_seq_fma_f32w(const float* w, int64_t cols, const float* x, float* y, bool acc) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t c64 = cols & ~int64_t{63};
  int64_t c = 0;
  for (; c < c64; c += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + c), _mm512_loadu_ps(x + c), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + c + 16), _mm512_loadu_ps(x + c + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + c + 32), _mm512_loadu_ps(x + c + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + c + 48), _mm512_loadu_ps(x + c + 48), a3);
  }
  for (; c < cols; c += 16) {
    const __mmask16 m = cols - c >= 16 ? __mmask16(0xffff) : _cvtu32_mask16((1u << (cols - c)) - 1u);
    a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + c), _mm512_maskz_loadu_ps(m, x + c), a0);
  }
  const float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  *y = acc ? *y + s : s;
}

// Dispatch of one (R-row block, token block of size t <= TMax) to the tile instantiation.
enum class Kind { dp, fma_bf16w, fma_f32w };

template <Kind K, int R, bool Tree = false>
AFD_AVX512 void run_tile(int t, const void* w, int64_t cols, const void* x, int64_t ldx, float* y,
                         int64_t ldy, bool acc, int64_t pf) {
#define AFD_TILE_CASE(TT)                                                                          \
  case TT:                                                                                         \
    if constexpr (K == Kind::dp)                                                                   \
      tile_dp<R, TT>(static_cast<const uint16_t*>(w), cols, static_cast<const uint16_t*>(x), ldx, y, \
                     ldy, acc, pf);                                                                \
    else if constexpr (K == Kind::fma_bf16w)                                                       \
      tile_fma_bf16w<R, TT, Tree>(static_cast<const uint16_t*>(w), cols, static_cast<const float*>(x), \
                                  ldx, y, ldy, acc, pf);                                           \
    else                                                                                           \
      tile_fma_f32w<R, TT, Tree>(static_cast<const float*>(w), cols, static_cast<const float*>(x), ldx, \
                                 y, ldy, acc, pf);                                                 \
    break;
  switch (t) {
    AFD_TILE_CASE(1)
    AFD_TILE_CASE(2)
    AFD_TILE_CASE(3)
    AFD_TILE_CASE(4)
    AFD_TILE_CASE(5)
    AFD_TILE_CASE(6)
    default: break;
  }
#undef AFD_TILE_CASE
}

// Largest token block per kind (accumulators + operands must fit the 32 zmm registers).
template <Kind K>
constexpr int kTMax = K == Kind::fma_bf16w ? 4 : 6;

template <Kind K, int R, bool Tree = false, typename WT, typename XT>
AFD_AVX512 void rows_r(const XT* x, int64_t n, int64_t ldx, const WT* w, int64_t cols, int64_t r0,
                       int64_t r1, float* y, int64_t ldy, bool acc, int64_t pf) {
  constexpr int TMax = kTMax<K>;
  for (int64_t i0 = 0; i0 < n; i0 += kTokenChunk) {
    const int64_t nc = std::min(kTokenChunk, n - i0);
    // Balanced token blocks: nb blocks of size ceil/floor(nc / nb).
    const int64_t nb = (nc + TMax - 1) / TMax;
    for (int64_t r = r0; r < r1;) {
      const bool full = r + R <= r1;
      int64_t i = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const int t = static_cast<int>((nc - i) / (nb - b));
        const XT* xb = x + (i0 + i) * ldx;
        float* yb = y + (i0 + i) * ldy + r;
        if (full)
          run_tile<K, R, Tree>(t, w + r * cols, cols, xb, ldx, yb, ldy, acc, pf);
        else
          run_tile<K, 1, Tree>(t, w + r * cols, cols, xb, ldx, yb, ldy, acc, pf);
        i += t;
      }
      r += full ? R : 1;
    }
  }
}

// ---- Small n (2..kSmallNMax tokens), bf16 x bf16 ----
// R rows x T <= TMax token tiles (balanced token blocks when n > TMax), four-at-a-time
// reductions, and a software prefetch of the next tile's rows at the same column: an R-row tile
// reads R short streams (one per row, cols * 2 bytes each) that the hardware prefetchers start
// late on every row, so without it the loads wait on memory while the vdpbf16ps units idle. The
// prefetch distance is a whole number of tiles, at least tuning.small_n_prefetch_min_bytes; only
// the first token block over a tile prefetches (the later ones find its rows in L1 or L2).
// x budget: x stays in L1 next to the W tile and its prefetched successor when the x slice a
// pass reads fits tuning.small_n_x_bytes; otherwise the columns are split into balanced blocks
// (multiples of 32) whose slice fits it, every block passing over the rows of a row chunk and
// leaving its tiles' accumulators in a buffer for the next block (tile_dp's part), so each
// output element is still one accumulator over all its columns.
// Loop orders:
// - the call's x fits the budget: tiles, then token blocks (the tile is reused from L1 by every
//   token block);
// - otherwise: row chunks of about tuning.small_n_chunk_bytes of W (0: the whole range), then
//   token blocks, then (within the block's x budget) column blocks and tiles. With several token
//   blocks the first one streams the chunk from memory, the later ones read it from L2, and each
//   block's x alone usually fits the budget, so W rows are read front to back instead of as the
//   short strided column segments that one block of all n tokens would need (which the hardware
//   prefetchers follow badly: docs/bench-log/2026-11-26-smalln.md). The last of several token
//   blocks, whose tiles compute from L2 while memory would idle, prefetches the next chunk into
//   L2 (the same tile one chunk ahead), so the next first block also reads from L2; a T1 hint,
//   because lines in L1 would evict the block's x.
// One tile: t tokens (t <= TMax) x R rows (1 row when !full) of cw columns; part, part_in,
// part_out: tile_dp's.
template <int R, int TMax>
AFD_AVX512 inline void tile_small_dp(int t, bool full, const uint16_t* w, int64_t cw, const uint16_t* x, int64_t ldx,
                                     float* y, int64_t ldy, bool acc, int64_t pf, int64_t ldw, int64_t pf_l2 = 0,
                                     float* part = nullptr, bool part_in = false, bool part_out = false) {
  switch (t) {
#define AFD_SMALL_CASE(TT)                                                                           \
  case TT:                                                                                           \
    if constexpr (TT <= TMax) {                                                                      \
      if (full) tile_dp<R, TT>(w, cw, x, ldx, y, ldy, acc, pf, ldw, pf_l2, part, part_in, part_out); \
      else tile_dp<1, TT>(w, cw, x, ldx, y, ldy, acc, pf, ldw, pf_l2, part, part_in, part_out);      \
    }                                                                                                \
    break;
    AFD_SMALL_CASE(1)
    AFD_SMALL_CASE(2)
    AFD_SMALL_CASE(3)
    AFD_SMALL_CASE(4)
    AFD_SMALL_CASE(5)
    AFD_SMALL_CASE(6)
    AFD_SMALL_CASE(7)
    AFD_SMALL_CASE(8)
#undef AFD_SMALL_CASE
    default: break;
  }
}

// Balanced column blocks of `cols` whose slice of x (t tokens) fits the budget.
inline int64_t small_n_cblock(int64_t t, int64_t cols, int64_t x_bytes) {
  const int64_t n_cblocks = std::max<int64_t>(1, (t * cols * 2 + x_bytes - 1) / x_bytes);
  return ((cols + n_cblocks - 1) / n_cblocks + 31) / 32 * 32;
}

template <int R, int TMax>
AFD_AVX512 void rows_small_dp(const uint16_t* x, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols, int64_t r0,
                              int64_t r1, float* y, int64_t ldy, bool acc, const LinearTuning& tuning,
                              ScratchSlot& scratch) {
  const int64_t tile_bytes = R * cols * 2;
  const int64_t pf_min = tuning.small_n_prefetch_min_bytes;
  const int64_t pf = (pf_min + tile_bytes - 1) / tile_bytes * tile_bytes;
  const int64_t nb = (n + TMax - 1) / TMax;
  const int64_t x_bytes = tuning.small_n_x_bytes;
  const int64_t chunk = tuning.small_n_chunk_bytes;
  if (n * cols * 2 <= x_bytes) {
    for (int64_t r = r0; r < r1;) {
      const bool full = r + R <= r1;
      int64_t i = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const int t = static_cast<int>((n - i) / (nb - b));
        tile_small_dp<R, TMax>(t, full, w + r * cols, cols, x + i * ldx, ldx, y + i * ldy + r, ldy, acc,
                               b == 0 ? pf : 0, cols);
        i += t;
      }
      r += full ? R : 1;
    }
    return;
  }
  // [rc rows][TMax tokens][16]: the accumulators of a chunk's tiles between column blocks, taken
  // when the columns are split.
  ScratchSlot::Frame frame(scratch);
  float* part = nullptr;
  const int64_t rc = chunk > 0 ? std::max<int64_t>(1, chunk / tile_bytes) * R : r1 - r0;
  for (int64_t c = r0; c < r1; c += rc) {
    const int64_t c1 = std::min(r1, c + rc);
    int64_t i = 0;
    for (int64_t b = 0; b < nb; ++b) {
      const int t = static_cast<int>((n - i) / (nb - b));
      const int64_t cblock = small_n_cblock(t, cols, x_bytes);
      if (cblock < cols && part == nullptr) part = scratch.take<float>(static_cast<size_t>(rc * TMax * 16));
      for (int64_t c0 = 0; c0 < cols; c0 += cblock)
        for (int64_t r = c; r < c1;) {
          const bool full = r + R <= c1;
          tile_small_dp<R, TMax>(t, full, w + r * cols + c0, std::min(cblock, cols - c0), x + i * ldx + c0, ldx,
                                 y + i * ldy + r, ldy, acc, b == 0 ? pf : 0, cols,
                                 nb > 1 && b == nb - 1 ? rc * cols * 2 : 0, part + (r - c) * t * 16, c0 > 0,
                                 c0 + cblock < cols);
          r += full ? R : 1;
        }
      i += t;
    }
  }
}

template <Kind K, typename WT, typename XT>
AFD_AVX512 void rows_generic(const XT* x, int64_t n, int64_t ldx, const WT* w, int64_t cols, int64_t r0, int64_t r1,
                             float* y, int64_t ldy, bool acc, const LinearTuning& tuning, ScratchSlot* scratch,
                             bool canonical = false) {
  const int64_t pf = tuning.prefetch_bytes;
  if constexpr (K != Kind::dp) {
    // f32 activations, canonical order at every n: the tiles (one accumulator chain per
    // element, reduce4 tree), n = 1 included.
    if (canonical) return rows_r<K, 4, true>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, n == 1 ? pf : 0);
  }
  // One token: no x reuse to exploit; rows one at a time (default) or interleaved tiles.
  const int rows_single = tuning.rows_single;
  const int small_n = tuning.small_n_layout;
  const bool row_seq = n == 1 ? rows_single == 1 : n <= std::min<int64_t>(tuning.row_seq_max_n, kRowSeqMaxN);
  if (K == Kind::dp && row_seq) {
    if constexpr (K == Kind::dp) {
      const int64_t pf_seq = n == 1 ? pf : tuning.row_seq_prefetch_bytes;
      if (tuning.row_streams == 4) rows_seq_dp_n<4>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, pf_seq);
      else if (tuning.row_streams == 2) rows_seq_dp_n<2>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, pf_seq);
      else rows_seq_dp_n<1>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, pf_seq);
    }
  } else if (n == 1 && rows_single == 1) {
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (K == Kind::fma_bf16w) row_seq_fma_bf16w(w + r * cols, cols, x, y + r, acc);
      else if constexpr (K == Kind::fma_f32w) row_seq_fma_f32w(w + r * cols, cols, x, y + r, acc);
    }
  } else if (n == 1 && rows_single == 8) {
    rows_r<K, 8>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, pf);
  } else if (K == Kind::dp && n >= 2 && n <= kSmallNMax && small_n != 0) {
    if constexpr (K == Kind::dp) {
      // n <= 4 (when row_seq_max_n < n): one row at a time (one W stream, see the next branch),
      // with the tiles' prefetch, whatever the row length (bench_kernels --small-n).
      if (n <= 4) rows_small_dp<1, 4>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, tuning, *scratch);
      else if (small_n == 3) rows_small_dp<3, 8>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, tuning, *scratch);
      else rows_small_dp<4, 6>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, tuning, *scratch);
    }
  } else if (rows_single == 1 && (n == 2 || (n <= 4 && cols <= 1024))) {
    // A few tokens (MoE experts at small decode batches): one W row at a time with one
    // accumulator per token, for the same sequential-stream reason: always for n = 2, for
    // n = 3..4 on rows of at most 1024 columns (on longer rows the tiles are faster).
    rows_r<K, 1>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, 0);
  } else {
    rows_r<K, 4>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, n == 1 ? pf : 0);
  }
}

}  // namespace

AFD_AVX512 void rows_dp_bf16_avx512(const uint16_t* xb, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols,
                                    int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc, ScratchSlot& scratch,
                                    const LinearTuning& tuning) {
  rows_generic<Kind::dp>(xb, n, ldx, w, cols, r0, r1, y, ldy, acc, tuning, &scratch);
}

AFD_AVX512 void rows_fma_bf16w_avx512(const float* xp, int64_t n, int64_t ldx, const uint16_t* w,
                                      int64_t cols, int64_t r0, int64_t r1, float* y, int64_t ldy,
                                      bool acc, const LinearTuning& tuning, bool canonical) {
  rows_generic<Kind::fma_bf16w>(xp, n, ldx, w, cols, r0, r1, y, ldy, acc, tuning, nullptr, canonical);
}

AFD_AVX512 void rows_fma_f32w_avx512(const float* x, int64_t n, int64_t ldx, const float* w, int64_t cols,
                                     int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc,
                                     const LinearTuning& tuning, bool canonical) {
  rows_generic<Kind::fma_f32w>(x, n, ldx, w, cols, r0, r1, y, ldy, acc, tuning, nullptr, canonical);
}

}  // namespace afd::kernels::detail
