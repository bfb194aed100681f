// AVX-512 kernels for linear_fp8() (see linear_fp8_kernels.h). Every function carries the
// target attribute; linear_fp8.cpp calls these only when active_isa() == Isa::avx512.
//
// e4m3 -> f32 through IEEE half, exactly: sign-extend the byte to 16 bits and shift left by 7,
// which puts the sign in bit 15, a copy of it in bit 14 and eeee mmm in bits 13..7; clearing
// bit 14 leaves the half s|0eeee|mmm0000000, whose value is the e4m3 value times 2^-8 for
// normal and subnormal inputs alike (half has the same 2^-14 subnormal step relative to its
// bias). vcvtph2ps widens that exactly; the 2^8 is folded into the block scale.
// The table variants instead look each 7-bit magnitude up in a 128-entry bf16 table and OR the
// sign back in: the exact bf16 value, for vdpbf16ps. The word table (four zmm, vpermt2w)
// converts 32 bytes per two lookups; the byte table (AVX-512 VBMI, vpermt2b) looks up the low
// and the high byte of 64 bf16 values in two lookups and interleaves them with unpacklo/hi,
// which leaves each 64-column group in the order [16k .. 16k+7 for k = 0..3 | 16k+8 .. 16k+15]:
// x is stored in that order (prep_x_fp8_gemv_bf16 with permute64).
// GCC 12 reports false -Wuninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>

#include "core/dtype.h"
#include "kernels/cpu/linear_fp8_kernels.h"
#include "kernels/cpu/prefetch.h"

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
inline __mmask32 mask32(int64_t n) { return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << n) - 1u); }

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

// ---- gemv, table conversion, vdpbf16ps ----
struct Bf16Table {
  alignas(64) std::array<uint16_t, 128> v;
};
const Bf16Table& bf16_magnitudes() {
  static const Bf16Table t = [] {
    Bf16Table r{};
    for (int i = 0; i < 128; ++i) {
      // 0x7f is NaN in e4m3; q never holds it (linear_fp8.h), any finite entry will do.
      const float f = i == 0x7f ? 480.0f : fp8_e4m3_to_f32(static_cast<uint8_t>(i));
      r.v[static_cast<size_t>(i)] = f32_to_bf16(f).bits;
    }
    return r;
  }();
  return t;
}

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

// 32 e4m3 bytes (already zero-extended to 16 bits) -> 32 exact bf16 values.
AFD_AVX512 inline __m512i lut32(const LutRegs& L, __m512i idx) {
  const __m512i lo = _mm512_permutex2var_epi16(L.t0, idx, L.t1);  // magnitudes 0..63 (index bits 0..5)
  const __m512i hi = _mm512_permutex2var_epi16(L.t2, idx, L.t3);  // 64..127
  const __mmask32 m = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x40));
  const __m512i mag = _mm512_mask_blend_epi16(m, lo, hi);
  // mag | ((idx << 8) & 0x8000): the sign bit.
  return _mm512_ternarylogic_epi32(mag, _mm512_slli_epi16(idx, 8), _mm512_set1_epi16(static_cast<int16_t>(0x8000)),
                                   0xF8);
}

template <int T>
AFD_AVX512 void gemv_row_lut(const LutRegs& L, const uint8_t* w, const float* srow, int64_t cols, const uint16_t* x,
                             int64_t ldx, float* y, int64_t ldy, bool acc, int64_t left) {
  __m512 a[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) a[t] = _mm512_setzero_ps();
  const int64_t nb = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = w + b * kFp8Block;
    const int64_t bc = std::min<int64_t>(kFp8Block, cols - b * kFp8Block);
    prefetch_ahead<2>(p, kPrefetchBytes, left - b * kFp8Block);
    __m512i wv[4];
    if (bc == kFp8Block) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k)
        wv[k] = lut32(L, _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * k))));
    } else {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k)
        wv[k] = 32 * k < bc ? lut32(L, _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask32(bc - 32 * k), p + 32 * k)))
                            : _mm512_setzero_si512();
    }
    const __m512 s = _mm512_set1_ps(srow[b]);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const uint16_t* xt = x + t * ldx + b * kFp8Block;
      __m512 s0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wv[0], (__m512bh)_mm512_loadu_si512(xt));
      __m512 s1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wv[1], (__m512bh)_mm512_loadu_si512(xt + 32));
      s0 = _mm512_dpbf16_ps(s0, (__m512bh)wv[2], (__m512bh)_mm512_loadu_si512(xt + 64));
      s1 = _mm512_dpbf16_ps(s1, (__m512bh)wv[3], (__m512bh)_mm512_loadu_si512(xt + 96));
      a[t] = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), s, a[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const float v = _mm512_reduce_add_ps(a[t]);
    float* o = y + t * ldy;
    *o = acc ? *o + v : v;
  }
}

// ---- gemv, byte-table conversion (VBMI), vdpbf16ps ----
struct ByteLutRegs {
  __m512i lo0, lo1, hi0, hi1;  // low / high bytes of the bf16 of magnitudes 0..63, 64..127
};

// 64 e4m3 bytes -> 64 exact bf16 values in two vectors, columns permuted (see above).
AFD_AVX512_VBMI inline void lut64(const ByteLutRegs& L, __m512i b, __m512i* w0, __m512i* w1) {
  const __m512i lo = _mm512_permutex2var_epi8(L.lo0, b, L.lo1);  // index bits 0..6; the sign bit is ignored
  __m512i hi = _mm512_permutex2var_epi8(L.hi0, b, L.hi1);
  hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (b & 0x80)
  *w0 = _mm512_unpacklo_epi8(lo, hi);
  *w1 = _mm512_unpackhi_epi8(lo, hi);
}

template <int T>
AFD_AVX512_VBMI void gemv_row_lut8(const ByteLutRegs& L, const uint8_t* w, const float* srow, int64_t cols,
                                   const uint16_t* x, int64_t ldx, float* y, int64_t ldy, bool acc, int64_t left) {
  __m512 a[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) a[t] = _mm512_setzero_ps();
  const int64_t nb = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = w + b * kFp8Block;
    const int64_t bc = std::min<int64_t>(kFp8Block, cols - b * kFp8Block);
    __m512i b0, b1;
    prefetch_ahead<2>(p, kPrefetchBytes, left - b * kFp8Block);
    if (bc == kFp8Block) {
      b0 = _mm512_loadu_si512(p);
      b1 = _mm512_loadu_si512(p + 64);
    } else {
      auto m64 = [](int64_t k) { return k >= 64 ? ~__mmask64{0} : k <= 0 ? __mmask64{0} : (__mmask64{1} << k) - 1; };
      b0 = _mm512_maskz_loadu_epi8(m64(bc), p);
      b1 = _mm512_maskz_loadu_epi8(m64(bc - 64), p + 64);
    }
    __m512i wv[4];
    lut64(L, b0, &wv[0], &wv[1]);
    lut64(L, b1, &wv[2], &wv[3]);
    const __m512 s = _mm512_set1_ps(srow[b]);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const uint16_t* xt = x + t * ldx + b * kFp8Block;
      __m512 s0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wv[0], (__m512bh)_mm512_loadu_si512(xt));
      __m512 s1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wv[1], (__m512bh)_mm512_loadu_si512(xt + 32));
      s0 = _mm512_dpbf16_ps(s0, (__m512bh)wv[2], (__m512bh)_mm512_loadu_si512(xt + 64));
      s1 = _mm512_dpbf16_ps(s1, (__m512bh)wv[3], (__m512bh)_mm512_loadu_si512(xt + 96));
      a[t] = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), s, a[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const float v = _mm512_reduce_add_ps(a[t]);
    float* o = y + t * ldy;
    *o = acc ? *o + v : v;
  }
}

inline const float* scale_row(const Fp8BlockWeights& w, int64_t r) {
  return w.scale + (r + w.row_offset) / kFp8Block * w.scale_stride;
}

}  // namespace

AFD_AVX512 void fp8_gemv_avx512(const float* xf, int64_t n, int64_t ldx, const Fp8BlockWeights& w, int64_t cols,
                                int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.q + r * cols;
    const float* sr = scale_row(w, r);
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

AFD_AVX512 void fp8_gemv_lut_avx512(const uint16_t* xb, int64_t n, int64_t ldx, const Fp8BlockWeights& w,
                                    int64_t cols, int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc) {
  const uint16_t* tab = bf16_magnitudes().v.data();
  const LutRegs L{_mm512_loadu_si512(tab), _mm512_loadu_si512(tab + 32), _mm512_loadu_si512(tab + 64),
                  _mm512_loadu_si512(tab + 96)};
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.q + r * cols;
    const float* sr = scale_row(w, r);
    const int64_t left = (r1 - r) * cols;  // bytes of this call's rows from the row's start
    for (int64_t i = 0; i < n; i += kMaxT) {
      const uint16_t* xi = xb + i * ldx;
      float* yi = y + i * ldy + r;
      switch (std::min<int64_t>(kMaxT, n - i)) {
        case 1: gemv_row_lut<1>(L, wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        case 2: gemv_row_lut<2>(L, wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        case 3: gemv_row_lut<3>(L, wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        default: gemv_row_lut<4>(L, wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
      }
    }
  }
}

AFD_AVX512_VBMI void fp8_gemv_lut8_avx512(const uint16_t* xb, int64_t n, int64_t ldx, const Fp8BlockWeights& w,
                                          int64_t cols, int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc) {
  alignas(64) uint8_t lo[128], hi[128];
  const uint16_t* tab = bf16_magnitudes().v.data();
  for (int i = 0; i < 128; ++i) {
    lo[i] = static_cast<uint8_t>(tab[i] & 0xff);
    hi[i] = static_cast<uint8_t>(tab[i] >> 8);
  }
  const ByteLutRegs L{_mm512_load_si512(lo), _mm512_load_si512(lo + 64), _mm512_load_si512(hi),
                      _mm512_load_si512(hi + 64)};
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.q + r * cols;
    const float* sr = scale_row(w, r);
    const int64_t left = (r1 - r) * cols;  // bytes of this call's rows from the row's start
    for (int64_t i = 0; i < n; i += kMaxT) {
      const uint16_t* xi = xb + i * ldx;
      float* yi = y + i * ldy + r;
      switch (std::min<int64_t>(kMaxT, n - i)) {
        case 1: gemv_row_lut8<1>(L, wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        case 2: gemv_row_lut8<2>(L, wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        case 3: gemv_row_lut8<3>(L, wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
        default: gemv_row_lut8<4>(L, wr, sr, cols, xi, ldx, yi, ldy, acc, left); break;
      }
    }
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
  alignas(64) uint16_t tabs[kTablesPerPass][kFp8Block];
  const float* mag = f32_magnitudes().v.data();
  const int64_t nb = (cols + kFp8Block - 1) / kFp8Block;
  const int64_t end = r1 * cols;  // W bytes past the last row of this call are not prefetched
  for (int64_t r = r0; r < r1;) {
    // Rows [r, re) share one scale row.
    const int64_t re = std::min(r1, (r + w.row_offset) / kFp8Block * kFp8Block + kFp8Block - w.row_offset);
    const float* sr = scale_row(w, r);
    for (int64_t b0 = 0; b0 < nb; b0 += kTablesPerPass) {
      const int64_t b1 = std::min(nb, b0 + kTablesPerPass);
      for (int64_t b = b0; b < b1; ++b) {
        const __m512 s = _mm512_set1_ps(sr[b]);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k)
          _mm512_store_si512(tabs[b - b0] + 32 * k,
                             (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_load_ps(mag + 32 * k + 16), s),
                                                          _mm512_mul_ps(_mm512_load_ps(mag + 32 * k), s)));
      }
      for (int64_t q = r; q < re; ++q) {
        for (int64_t b = b0; b < b1; ++b) {
          const uint16_t* t = tabs[b - b0];
          const LutRegs L{_mm512_load_si512(t), _mm512_load_si512(t + 32), _mm512_load_si512(t + 64),
                          _mm512_load_si512(t + 96)};
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
    r = re;
  }
}

AFD_AVX512 void fp8_dequant_rows_f32_avx512(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1,
                                            float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.q + r * cols;
    const float* sr = scale_row(w, r);
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
