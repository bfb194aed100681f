// AVX-512 BF16 kernel of linear() for many tokens (the "pairs" layout): the vector lanes are
// 16 tokens, so no accumulator needs a horizontal reduction.
//
// x is prepared once per call into token blocks of 16 (prep_x_bf16_pairs): block b holds, for
// column pair k, in lane l the bf16 pair (x[16 b + l][2k], x[16 b + l][2k + 1]) — one zmm per
// (block, pair). W stays as it lies in memory: row r's pair k (two bf16 = 32 bits) is broadcast
// to all lanes, and vdpbf16ps adds x[t][2k] w[r][2k] + x[t][2k+1] w[r][2k+1] into lane t. A
// register tile is kR rows x kTB token blocks (24 accumulators, 4 x vectors, one broadcast); the
// tile's sums go through a small buffer into y (or are added to it).
// Two orders (P lane classes, pair k in class k % P):
// - P = 1 (LinearOrder::fastest): one chain per (row, token) over the pairs in order, one pass
//   over the tile, W's lines read once and reused from L1 by 16 consecutive pairs;
// - P = 16 (the canonical order of linear_kernels.h): one chain per class, 16 passes over the
//   tile, whose 16 class sums are added with the canonical tree (a vector add per node: the
//   lanes are tokens). x is laid out class-major, so each pass reads it in order; a tile's W
//   (24 KiB at 2048 columns) is read by every pass, on long rows from a class-major copy made
//   once per tile, else in place (one dword per line per pass); passes 1..kR prefetch the next
//   tile's rows into L2.
// Loop order: groups of kTB token blocks (the group's x stays in L2) outer, row tiles inner.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"

namespace afd::kernels::detail {

namespace {

constexpr int kR = 6;   // W rows per register tile
constexpr int kTB = 4;  // 16-token blocks per register tile
// The canonical kernel copies each tile's W class-major (transpose_w_classes) on rows longer than
// this: hot, one thread, n = 128, against the one-chain kernel, the copy took the 16 passes from
// 1.40 to 1.13 of its time at 4096 columns and from 1.31 to 1.17 at 2048, but from 1.13 to 1.26
// at 768, where the tile's W stays in L1 between passes anyway.
constexpr int64_t kTransposeMinCols = 1024;

#define AFD_AVX512_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c"), always_inline)) inline
#define AFD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

// The order in which pair_tile runs the 16 lane classes, so that the canonical tree's nodes
// complete as early as possible: S_q = (L[4q] + L[4q + 2]) + (L[4q + 1] + L[4q + 3]).
constexpr int kClassOrder[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};

// W's pairs of rows [0, R) (rows kp pairs apart, kp = cols / 2) class-major into wt
// [R][16][pcp] (row, class j, index c of pair 16 c + j; pcp = ceil(kp / 256) * 16, zeros past kp):
// 16 x 16 transposes of 16 chunks of 16 pairs.
template <int R>
AFD_AVX512_INLINE void transpose_w_classes(const uint32_t* w32, int64_t kp, int64_t pcp, uint32_t* wt) {
  for (int r = 0; r < R; ++r)
    for (int64_t c0 = 0; c0 < pcp; c0 += 16) {
      __m512i v[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t k = 16 * (c0 + i), left = kp - k;
        v[i] = left >= 16 ? _mm512_loadu_si512(w32 + r * kp + k)
               : left > 0 ? _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << left) - 1u), w32 + r * kp + k)
                          : _mm512_setzero_si512();
      }
      __m512i t[16], u[16];
#pragma GCC unroll 8
      for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
      }
      // u[4 g + m], 128-bit lane L: pair 4 L + m of chunks 4 g .. 4 g + 3.
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
      }
      uint32_t* o = wt + r * 16 * pcp + c0;
#pragma GCC unroll 4
      for (int m = 0; m < 4; ++m) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i x1 = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i x2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i x3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(3, 1, 3, 1));
        _mm512_storeu_si512(o + (m)*pcp, _mm512_shuffle_i32x4(x0, x2, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_si512(o + (4 + m) * pcp, _mm512_shuffle_i32x4(x1, x3, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_si512(o + (8 + m) * pcp, _mm512_shuffle_i32x4(x0, x2, _MM_SHUFFLE(3, 1, 3, 1)));
        _mm512_storeu_si512(o + (12 + m) * pcp, _mm512_shuffle_i32x4(x1, x3, _MM_SHUFFLE(3, 1, 3, 1)));
      }
    }
}

// tmp[r][16 tb + l] = the sum over the pairs of token 16 tb + l and W row r in the order of P
// (1 or 16 lane classes), for R rows and TB token blocks; xp: the first block (blocks xblk uint16
// apart, laid out for P), w: row 0 (rows cols apart).
template <int P, int R, int TB>
AFD_AVX512_INLINE void pair_tile(const uint16_t* xp, int64_t xblk, const uint16_t* w, int64_t cols, float* tmp,
                                 uint32_t* wt) {
  // P = 16: the tree's partial nodes between passes: [0] L[4q] (+ L[4q + 2]), [1] L[4q + 1],
  // [2 + q] S_q.
  alignas(64) float node[P == 16 ? 6 : 1][R][TB][16];
  const int64_t kp = cols / 2, per_class = (kp + P - 1) / P;
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(w);
  const char* w_next = reinterpret_cast<const char*>(w + R * cols);
  const int64_t pcp = (kp + 255) / 256 * 16;
  if constexpr (P == 16)
    if (wt != nullptr) transpose_w_classes<R>(w32, kp, pcp, wt);
  for (int q = 0; q < P; ++q) {
    const int j = P == 16 ? kClassOrder[q] : 0;
    __m512 a[R][TB];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int b = 0; b < TB; ++b) a[r][b] = _mm512_setzero_ps();
    // Pairs k = P c + j < kp (the rest are zero padding in x, which W does not have).
    const int64_t nc = (kp - j + P - 1) / P;
    const uint16_t* xj = xp + 32 * (j * per_class);
    // Row r's pair P c + j at wj[r * ws + P' c]: in the class-major copy wt (P' = 1) or in W.
    const bool copy = P == 16 && wt != nullptr;
    const uint32_t* wj = copy ? wt + j * pcp : w32 + j;
    const int64_t ws = copy ? 16 * pcp : kp, cs = copy ? 1 : P;
    const char* pf = P == 16 && q >= 1 && q <= R ? w_next + (q - 1) * cols * 2 : nullptr;
    for (int64_t c = 0; c < nc; ++c) {
      if (pf) _mm_prefetch(pf + 64 * c, _MM_HINT_T1);
      __m512bh xv[TB];
#pragma GCC unroll 8
      for (int b = 0; b < TB; ++b) xv[b] = (__m512bh)_mm512_loadu_si512(xj + b * xblk + 32 * c);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512bh wv = (__m512bh)_mm512_set1_epi32(static_cast<int>(wj[r * ws + cs * c]));
#pragma GCC unroll 8
        for (int b = 0; b < TB; ++b) a[r][b] = _mm512_dpbf16_ps(a[r][b], xv[b], wv);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int b = 0; b < TB; ++b) {
        if constexpr (P == 1) {
          _mm512_storeu_ps(tmp + r * (16 * kTB) + 16 * b, a[r][b]);
          continue;
        }
        switch (q % 4) {
          case 0: _mm512_store_ps(node[0][r][b], a[r][b]); break;
          case 1: _mm512_store_ps(node[0][r][b], _mm512_add_ps(_mm512_load_ps(node[0][r][b]), a[r][b])); break;
          case 2: _mm512_store_ps(node[1][r][b], a[r][b]); break;
          default:
            _mm512_store_ps(
                node[2 + q / 4][r][b],
                _mm512_add_ps(_mm512_load_ps(node[0][r][b]), _mm512_add_ps(_mm512_load_ps(node[1][r][b]), a[r][b])));
            break;
        }
      }
  }
  if constexpr (P == 16) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int b = 0; b < TB; ++b) {
        const __m512 s02 = _mm512_add_ps(_mm512_load_ps(node[2][r][b]), _mm512_load_ps(node[4][r][b]));
        const __m512 s13 = _mm512_add_ps(_mm512_load_ps(node[3][r][b]), _mm512_load_ps(node[5][r][b]));
        _mm512_storeu_ps(tmp + r * (16 * kTB) + 16 * b, _mm512_add_ps(s02, s13));
      }
  }
}

template <int P, int R>
AFD_AVX512 void pair_tile_r(int tb, const uint16_t* xp, int64_t xblk, const uint16_t* w, int64_t cols, float* tmp,
                            uint32_t* wt) {
  switch (tb) {
    case 1: pair_tile<P, R, 1>(xp, xblk, w, cols, tmp, wt); break;
    case 2: pair_tile<P, R, 2>(xp, xblk, w, cols, tmp, wt); break;
    case 3: pair_tile<P, R, 3>(xp, xblk, w, cols, tmp, wt); break;
    default: pair_tile<P, R, 4>(xp, xblk, w, cols, tmp, wt); break;
  }
}

template <int P>
AFD_AVX512 void pair_tile_any(int rr, int tb, const uint16_t* xp, int64_t xblk, const uint16_t* w, int64_t cols,
                              float* tmp, uint32_t* wt) {
  switch (rr) {
    case 1: pair_tile_r<P, 1>(tb, xp, xblk, w, cols, tmp, wt); break;
    case 2: pair_tile_r<P, 2>(tb, xp, xblk, w, cols, tmp, wt); break;
    case 3: pair_tile_r<P, 3>(tb, xp, xblk, w, cols, tmp, wt); break;
    case 4: pair_tile_r<P, 4>(tb, xp, xblk, w, cols, tmp, wt); break;
    case 5: pair_tile_r<P, 5>(tb, xp, xblk, w, cols, tmp, wt); break;
    default: pair_tile_r<P, 6>(tb, xp, xblk, w, cols, tmp, wt); break;
  }
}

}  // namespace

void prep_x_bf16_pairs(const float* x, int64_t n, int64_t x_stride, int64_t cols, uint16_t* xp, int64_t ldx,
                       bool canonical) {
  const int64_t nblk = (n + 15) / 16, kp = ldx / 2, P = canonical ? 16 : 1, per_class = kp / P;
  std::memset(xp, 0, static_cast<size_t>(nblk * 16 * ldx) * sizeof(uint16_t));
  uint32_t* xp32 = reinterpret_cast<uint32_t*>(xp);
  // kPrepCols columns of a row at a time (a multiple of 32, as ldx is), rounded to bf16 into a
  // buffer on the stack (zero past cols), then their pairs scattered to their places.
  constexpr int64_t kPrepCols = 512;
  alignas(64) uint16_t blk[kPrepCols];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / 16, l = i % 16;
    uint32_t* dst = xp32 + b * 16 * kp + l;
    for (int64_t c0 = 0; c0 < ldx; c0 += kPrepCols) {
      const int64_t len = std::min(kPrepCols, ldx - c0), nc = std::clamp<int64_t>(cols - c0, 0, len);
      if (nc > 0) f32_to_bf16_row(x + i * x_stride + c0, nc, blk);
      std::fill(blk + nc, blk + len, uint16_t{0});
      for (int64_t k = c0 / 2; k < (c0 + len) / 2; ++k) {
        uint32_t v;
        std::memcpy(&v, &blk[2 * k - c0], 4);
        dst[16 * ((k % P) * per_class + k / P)] = v;
      }
    }
  }
}

AFD_AVX512 void rows_dp_bf16_pairs_avx512(const uint16_t* xp, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols,
                                          int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc, ScratchSlot& scratch,
                                          bool canonical) {
  const int64_t nblk = (n + 15) / 16, xblk = 16 * ldx;
  alignas(64) float tmp[kR * 16 * kTB];
  // [kR][16][pcp]: the canonical kernel's class-major copy of a tile's W (pair_tile), for rows
  // longer than kTransposeMinCols.
  ScratchSlot::Frame frame(scratch);
  const bool transpose = canonical && cols > kTransposeMinCols;
  uint32_t* const wt = transpose ? scratch.take<uint32_t>(static_cast<size_t>(kR * 16 * ((cols / 2 + 255) / 256 * 16)))
                                 : nullptr;
  for (int64_t b0 = 0; b0 < nblk; b0 += kTB) {
    const int tb = static_cast<int>(std::min<int64_t>(kTB, nblk - b0));
    const int64_t t0 = 16 * b0, nt = std::min<int64_t>(16 * tb, n - t0);
    for (int64_t r = r0; r < r1; r += kR) {
      const int rr = static_cast<int>(std::min<int64_t>(kR, r1 - r));
      if (canonical) pair_tile_any<16>(rr, tb, xp + b0 * xblk, xblk, w + r * cols, cols, tmp, wt);
      else pair_tile_any<1>(rr, tb, xp + b0 * xblk, xblk, w + r * cols, cols, tmp, nullptr);
      for (int64_t t = 0; t < nt; ++t) {
        float* yt = y + (t0 + t) * ldy + r;
        for (int i = 0; i < rr; ++i) {
          const float s = tmp[i * (16 * kTB) + t];
          yt[i] = acc ? yt[i] + s : s;
        }
      }
    }
  }
}

}  // namespace afd::kernels::detail
