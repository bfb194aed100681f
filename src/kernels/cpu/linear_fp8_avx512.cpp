// AVX-512 kernels for linear_fp8() (see linear_fp8_kernels.h). Every function carries the
// target attribute; linear_fp8.cpp calls these only when active_isa() == Isa::avx512.
//
// e4m3 -> f32 through IEEE half, exactly (f32 activations): sign-extend the byte to 16 bits and
// shift left by 7, which puts the sign in bit 15, a copy of it in bit 14 and eeee mmm in bits
// 13..7; clearing bit 14 leaves the half s|0eeee|mmm0000000, whose value is the e4m3 value times
// 2^-8 for normal and subnormal inputs alike (half has the same 2^-14 subnormal step relative to
// its bias). vcvtph2ps widens that exactly; the 2^8 is folded into the block scale.
// bf16 activations use scaled tables: for one 128 x 128 block, entry m is bf16(mag(m) * scale)
// (the f32 product rounded to nearest even, as vcvtne2ps2bf16 rounds), and a byte q converts to
// that entry with q's sign XORed in, which is bf16(fp8(q) * scale) exactly (rounding to nearest
// even is symmetric in the sign). The word table (four zmm, vpermt2w; the tiles' dequantization)
// converts 32 bytes per two lookups; the byte tables (AVX-512 VBMI, vpermt2b; the gemv) look up
// the low and the high byte of 64 bf16 values in two lookups and interleave them with
// unpacklo/hi, after one vpermb that orders the 64 W bytes so that the interleaved words come
// out in column order.
// GCC 12 reports false -Wuninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/hsum.h"
#include "kernels/cpu/linear_fp8_kernels.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/row_streams.h"

#define AFD_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
#define AFD_AVX512_VBMI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,avx2,fma,f16c")))

namespace afd::kernels::detail {

namespace {

constexpr int kMaxT = 4;  // tokens per pass over a row
// W bytes prefetched ahead of the block being converted, gemv and tile dequantization alike
// (the distance: bench_kernels --fp8-dequant, docs/bench-log/2026-11-26-fp8-prefetch.md).
constexpr int64_t kPrefetchBytes = 8192;

AFD_AVX512 inline __m512 half_bits_to_f32(__m256i h) {
  h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
  return _mm512_cvtph_ps(h);
}
// 16 e4m3 bytes at p -> 16 floats, each 2^-8 times its value.
AFD_AVX512 inline __m512 cvt16(const uint8_t* p) {
  return half_bits_to_f32(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
AFD_AVX512 inline __m512 cvt16_mask(const uint8_t* p, __mmask16 m) {
  return half_bits_to_f32(_mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(m, p)));
}
inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1u); }
inline __mmask32 mask32(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : n <= 0 ? __mmask32{0} : static_cast<__mmask32>((1u << n) - 1u);
}

// ---- gemv, half conversion, f32 FMA ----
// T tokens of one row: x [T, ldx] (zero padded to whole blocks), y[t * ldy].
template <int T>
AFD_AVX512 void gemv_row(const uint8_t* w, const float* srow, int64_t cols, const float* x, int64_t ldx, float* y,
                         int64_t ldy, bool acc, int64_t left) {
  __m512 a[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) a[t] = _mm512_setzero_ps();
  const int64_t nfull = cols / kFp8Block;
  for (int64_t b = 0; b < nfull; ++b) {
    const uint8_t* p = w + b * kFp8Block;
    prefetch_ahead<2>(p, kPrefetchBytes, left - b * kFp8Block);
    __m512 wv[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) wv[k] = cvt16(p + 16 * k);
    const __m512 s = _mm512_set1_ps(srow[b] * 256.0f);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const float* xt = x + t * ldx + b * kFp8Block;
      __m512 s0 = _mm512_mul_ps(wv[0], _mm512_loadu_ps(xt));
      __m512 s1 = _mm512_mul_ps(wv[1], _mm512_loadu_ps(xt + 16));
      s0 = _mm512_fmadd_ps(wv[2], _mm512_loadu_ps(xt + 32), s0);
      s1 = _mm512_fmadd_ps(wv[3], _mm512_loadu_ps(xt + 48), s1);
      s0 = _mm512_fmadd_ps(wv[4], _mm512_loadu_ps(xt + 64), s0);
      s1 = _mm512_fmadd_ps(wv[5], _mm512_loadu_ps(xt + 80), s1);
      s0 = _mm512_fmadd_ps(wv[6], _mm512_loadu_ps(xt + 96), s0);
      s1 = _mm512_fmadd_ps(wv[7], _mm512_loadu_ps(xt + 112), s1);
      a[t] = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), s, a[t]);
    }
  }
  const int64_t rem = cols - nfull * kFp8Block;
  if (rem > 0) {
    // Partial last block: W is read only up to cols (masked loads); x is zero beyond cols.
    const uint8_t* p = w + nfull * kFp8Block;
    const __m512 s = _mm512_set1_ps(srow[nfull] * 256.0f);
    __m512 part[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) part[t] = _mm512_setzero_ps();
    for (int64_t k = 0; k * 16 < rem; ++k) {
      const __m512 wv = cvt16_mask(p + 16 * k, mask16(rem - 16 * k));
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        part[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + t * ldx + nfull * kFp8Block + 16 * k), part[t]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) a[t] = _mm512_fmadd_ps(part[t], s, a[t]);
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const float v = _mm512_reduce_add_ps(a[t]);
    float* o = y + t * ldy;
    *o = acc ? *o + v : v;
  }
}

// ---- bf16 activations: scaled tables, vdpbf16ps ----
// The 128 e4m3 magnitudes as f32 (0x7f, NaN, never occurs in q: any finite entry will do).
struct F32Table {
  alignas(64) std::array<float, 128> v;
};
const F32Table& f32_magnitudes() {
  static const F32Table t = [] {
    F32Table r{};
    for (int i = 0; i < 128; ++i)
      r.v[static_cast<size_t>(i)] = i == 0x7f ? 480.0f : fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return r;
  }();
  return t;
}

struct LutRegs {
  __m512i t0, t1, t2, t3;
};

// 32 e4m3 bytes (already zero-extended to 16 bits) -> 32 bf16 table entries, q's sign XORed in.
AFD_AVX512 inline __m512i lut32(const LutRegs& L, __m512i idx) {
  const __m512i lo = _mm512_permutex2var_epi16(L.t0, idx, L.t1);  // magnitudes 0..63 (index bits 0..5)
  const __m512i hi = _mm512_permutex2var_epi16(L.t2, idx, L.t3);  // 64..127
  const __mmask32 m = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x40));
  const __m512i mag = _mm512_mask_blend_epi16(m, lo, hi);
  // mag ^ ((idx << 8) & 0x8000): the sign bit.
  return _mm512_ternarylogic_epi32(mag, _mm512_slli_epi16(idx, 8), _mm512_set1_epi16(static_cast<int16_t>(0x8000)),
                                   0x78);
}
AFD_AVX512 inline LutRegs load_lut(const uint16_t* t) {
  return {_mm512_loadu_si512(t), _mm512_loadu_si512(t + 32), _mm512_loadu_si512(t + 64), _mm512_loadu_si512(t + 96)};
}

// tabs[(b - b0) * 128 + m] = bf16(mag(m) * sr[b]) for the blocks b in [b0, b1).
AFD_AVX512 void scaled_tables(const float* sr, int64_t b0, int64_t b1, uint16_t* tabs) {
  const float* mag = f32_magnitudes().v.data();
  for (int64_t b = b0; b < b1; ++b) {
    const __m512 s = _mm512_set1_ps(sr[b]);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      _mm512_storeu_si512(tabs + (b - b0) * kFp8Block + 32 * k,
                          (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_load_ps(mag + 32 * k + 16), s),
                                                       _mm512_mul_ps(_mm512_load_ps(mag + 32 * k), s)));
  }
}

// ---- byte tables (VBMI) ----
struct ByteLutRegs {
  __m512i lo0, lo1, hi0, hi1;  // low / high bytes of the entries of magnitudes 0..63, 64..127
};

// The nb word tables at tabs, in place, to byte tables: per block [lo0 | lo1 | hi0 | hi1].
AFD_AVX512_VBMI void word_to_byte_tables(uint16_t* tabs, int64_t nb) {
  alignas(64) uint8_t even[64], odd[64];
  for (int i = 0; i < 64; ++i) {
    even[i] = static_cast<uint8_t>(2 * i);
    odd[i] = static_cast<uint8_t>(2 * i + 1);
  }
  const __m512i ie = _mm512_load_si512(even), io = _mm512_load_si512(odd);
  for (int64_t b = 0; b < nb; ++b) {
    uint16_t* t = tabs + b * kFp8Block;
    const LutRegs L = load_lut(t);
    const __m512i lo0 = _mm512_permutex2var_epi8(L.t0, ie, L.t1), hi0 = _mm512_permutex2var_epi8(L.t0, io, L.t1);
    const __m512i lo1 = _mm512_permutex2var_epi8(L.t2, ie, L.t3), hi1 = _mm512_permutex2var_epi8(L.t2, io, L.t3);
    _mm512_storeu_si512(t, lo0);
    _mm512_storeu_si512(t + 32, lo1);
    _mm512_storeu_si512(t + 64, hi0);
    _mm512_storeu_si512(t + 96, hi1);
  }
}

// 64 e4m3 bytes (ordered by byte_order()) -> 64 bf16 table entries in column order, q's sign
// XORed in: w0 columns 0..31, w1 columns 32..63.
AFD_AVX512_VBMI inline void lut64(const ByteLutRegs& L, __m512i b, __m512i* w0, __m512i* w1) {
  const __m512i lo = _mm512_permutex2var_epi8(L.lo0, b, L.lo1);  // index bits 0..6; the sign bit is ignored
  __m512i hi = _mm512_permutex2var_epi8(L.hi0, b, L.hi1);
  hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(static_cast<char>(0x80)), 0x78);  // hi ^ (b & 0x80)
  *w0 = _mm512_unpacklo_epi8(lo, hi);
  *w1 = _mm512_unpackhi_epi8(lo, hi);
}
// vpermb index: unpacklo/hi take bytes 16k..16k+7 / 16k+8..16k+15 of each 128-bit lane k, so
// byte 16k + i holds column 8k + i and byte 16k + 8 + i column 32 + 8k + i (i < 8).
AFD_AVX512_VBMI inline __m512i byte_order() {
  alignas(64) uint8_t idx[64];
  for (int p = 0; p < 64; ++p) idx[p] = static_cast<uint8_t>((p % 16 < 8 ? 0 : 32) + 8 * (p / 16) + p % 8);
  return _mm512_load_si512(idx);
}

inline __mmask64 mask64(int64_t n) {
  return n >= 64 ? ~__mmask64{0} : n <= 0 ? __mmask64{0} : (__mmask64{1} << n) - 1;
}

// ---- gemv with bf16 activations: the bf16 order of linear_kernels.h ----
// R rows (w[r]; the tables `tabs` of their common scale row) x T tokens (x [T, ldx] bf16, zero
// padded): one accumulator per output, the 32-column chunks in ascending order (the last one
// zero padded) into it with vdpbf16ps, hsum16, y[r] + t * ldy (+)= the sum. left[r]: bytes of
// this call's rows from row r's start (prefetch bound).
template <int R, int T>
AFD_AVX512_VBMI void gemv_tile_dp(const uint16_t* tabs, const uint8_t* const* w, const int64_t* left, int64_t cols,
                                  const uint16_t* x, int64_t ldx, float* const* y, int64_t ldy, bool acc) {
  __m512 a[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_ps();
  const __m512i order = byte_order();
  const int64_t nb = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t b = 0; b < nb; ++b) {
    const uint16_t* tb = tabs + b * kFp8Block;
    const ByteLutRegs L{_mm512_loadu_si512(tb), _mm512_loadu_si512(tb + 32), _mm512_loadu_si512(tb + 64),
                        _mm512_loadu_si512(tb + 96)};
    const int64_t c0 = b * kFp8Block, bc = std::min<int64_t>(kFp8Block, cols - c0);
    // Software prefetch for token blocks of 2+ only: at one token the hardware prefetchers keep
    // up with the 4 streams (a prefetch measured about 10 % slower there, and faster at 2..4).
    if constexpr (T > 1) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) prefetch_ahead<2>(w[r] + c0, kPrefetchBytes, left[r] - c0);
    }
    // Two halves of 64 columns: convert R rows' bytes, then their two 32-column chunks.
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const int64_t hc = bc - 64 * h;  // columns of this half within cols
      if (hc <= 0) break;
      __m512i wv[R][2];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = w[r] + c0 + 64 * h;
        const __m512i bytes = hc >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(mask64(hc), p);
        lut64(L, _mm512_permutexvar_epi8(order, bytes), &wv[r][0], &wv[r][1]);
        if (hc < 64) {
          // Columns past cols are zero (not the entry of byte 0, which a non-finite scale makes NaN).
          wv[r][0] = _mm512_maskz_mov_epi16(mask32(hc), wv[r][0]);
          wv[r][1] = _mm512_maskz_mov_epi16(mask32(hc - 32), wv[r][1]);
        }
      }
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        if (32 * k >= hc) break;  // chunks past cols are not summed
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + t * ldx + c0 + 64 * h + 32 * k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) a[r][t] = _mm512_dpbf16_ps(a[r][t], (__m512bh)wv[r][k], xv);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const float v = hsum16(a[r][t]);
      float* o = y[r] + t * ldy;
      *o = acc ? *o + v : v;
    }
}

// Rows [r0, r1) sharing one scale row (tables `tabs`), all n tokens: sets of 4 rows from 4
// sequential streams (stream_sets), each set for the token blocks of <= kMaxT (4 rows x up to 4
// tokens: enough independent vdpbf16ps chains to cover its latency). r_end: the end of the
// call's rows (prefetch bound).
AFD_AVX512_VBMI void gemv_rows_dp(const uint16_t* tabs, const uint16_t* xb, int64_t n, int64_t ldx,
                                  const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, int64_t r_end,
                                  float* y, int64_t ldy, bool acc) {
  constexpr int R = 4;
  stream_sets<R>(r0, r1, [&](int rn, const int64_t* rows) {
    const uint8_t* wr[R];
    int64_t left[R];
    for (int k = 0; k < rn; ++k) {
      wr[k] = w.q + rows[k] * cols;
      left[k] = (r_end - rows[k]) * cols;
    }
    for (int64_t i = 0; i < n; i += kMaxT) {
      float* yr[R];
      for (int k = 0; k < rn; ++k) yr[k] = y + i * ldy + rows[k];
      const uint16_t* xi = xb + i * ldx;
      with_tile_shape<R>(rn, std::min<int64_t>(kMaxT, n - i), [&](auto rr, auto tt) {
        gemv_tile_dp<decltype(rr)::value, decltype(tt)::value>(tabs, wr, left, cols, xi, ldx, yr, ldy, acc);
      });
    }
  });
}

}  // namespace

AFD_AVX512 void fp8_gemv_avx512(const float* xf, int64_t n, int64_t ldx, const Fp8BlockWeights& w, int64_t cols,
                                int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.q + r * cols;
    const float* sr = fp8_scale_row(w, r);
    const int64_t left = (r1 - r) * cols;  // bytes of this call's rows from the row's start
    for (int64_t i = 0; i < n; i += kMaxT) {
      const float* xi = xf + i * ldx;
      float* yi = y + i * ldy + r;
      switch (std::min<int64_t>(kMaxT, n - i)) {
        case 1: gemv_row<1>(wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        case 2: gemv_row<2>(wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        case 3: gemv_row<3>(wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        default: gemv_row<4>(wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
      }
    }
  }
}

AFD_AVX512_VBMI void fp8_gemv_lut8_avx512(const uint16_t* xb, int64_t n, int64_t ldx, const Fp8BlockWeights& w,
                                          int64_t cols, int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc,
                                          ScratchSlot& scratch) {
  const int64_t nb = (cols + kFp8Block - 1) / kFp8Block;
  ScratchSlot::Frame frame(scratch);
  uint16_t* tabs = scratch.take<uint16_t>(static_cast<size_t>(nb * kFp8Block));
  for (int64_t r = r0, re; r < r1; r = re) {
    re = fp8_scale_run_end(w, r, r1);
    scaled_tables(fp8_scale_row(w, r), 0, nb, tabs);
    word_to_byte_tables(tabs, nb);
    gemv_rows_dp(tabs, xb, n, ldx, w, cols, r, re, r1, y, ldy, acc);
  }
}

// Table conversion with the scale folded in: for each 128-column block of a run of rows that
// share a scale row, the 128 magnitudes times the block's scale are rounded to bf16 once into a
// table (the same f32 product and rounding as converting each element), and every byte of the
// block is looked up in it (lut32: two vpermi2w and the sign bit). The tables of up to
// kTablesPerPass blocks are built first, then the rows are walked in memory order (W streams
// sequentially instead of 128-byte pieces at a stride of cols).
AFD_AVX512 void fp8_dequant_rows_bf16_avx512(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1,
                                             uint16_t* out) {
  constexpr int64_t kTablesPerPass = 64;
  alignas(64) uint16_t tabs[kTablesPerPass * kFp8Block];
  const int64_t nb = (cols + kFp8Block - 1) / kFp8Block;
  const int64_t end = r1 * cols;  // W bytes past the last row of this call are not prefetched
  for (int64_t r = r0, re; r < r1; r = re) {
    re = fp8_scale_run_end(w, r, r1);
    for (int64_t b0 = 0; b0 < nb; b0 += kTablesPerPass) {
      const int64_t b1 = std::min(nb, b0 + kTablesPerPass);
      scaled_tables(fp8_scale_row(w, r), b0, b1, tabs);
      for (int64_t q = r; q < re; ++q) {
        for (int64_t b = b0; b < b1; ++b) {
          const LutRegs L = load_lut(tabs + (b - b0) * kFp8Block);
          const int64_t c0 = b * kFp8Block;
          const uint8_t* p = w.q + q * cols + c0;
          uint16_t* o = out + (q - r0) * cols + c0;
          const int64_t bc = std::min<int64_t>(kFp8Block, cols - c0);
          prefetch_ahead<2>(p, kPrefetchBytes, end - q * cols - c0);
          if (bc == kFp8Block) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k)
              _mm512_storeu_si512(
                  o + 32 * k,
                  lut32(L, _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * k)))));
          } else {
            for (int64_t k = 0; 32 * k < bc; ++k) {
              const __mmask32 m = mask32(bc - 32 * k);
              _mm512_mask_storeu_epi16(o + 32 * k, m,
                                       lut32(L, _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, p + 32 * k))));
            }
          }
        }
      }
    }
  }
}

AFD_AVX512 void fp8_dequant_rows_f32_avx512(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1,
                                            float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.q + r * cols;
    const float* sr = fp8_scale_row(w, r);
    float* o = out + (r - r0) * cols;
    for (int64_t c = 0; c < cols; c += 16) {
      const __m512 s = _mm512_set1_ps(sr[c / kFp8Block] * 256.0f);
      if (cols - c >= 16) {
        _mm512_storeu_ps(o + c, _mm512_mul_ps(cvt16(q + c), s));
      } else {
        const __mmask16 m = mask16(cols - c);
        _mm512_mask_storeu_ps(o + c, m, _mm512_mul_ps(cvt16_mask(q + c, m), s));
      }
    }
  }
}

}  // namespace afd::kernels::detail
