// The tiled AVX-512 version of gqa_decode_attend (gqa_attention_kernels.h). Every function
// carries the target attribute; gqa_attention.cpp calls it only on CPUs with AVX-512 F/BW/VL/DQ.
// GCC 12 reports false -Wmaybe-uninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593), as in elementwise_avx512.cpp.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/gqa_attention_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/score_tile_avx512.h"

namespace afd::kernels::detail {

namespace {

// ---------------------------------------------------------------------------------------
// Tiled AVX-512 kernel (bf16, f32 and fp8 e4m3 KV; head_dim % 16 == 0).
//
// Contract: gqa_decode_attend's (G = n_heads heads, positions [j0, n_ctx)); the softmax is
// kernels::softmax over the f32 scores, as in the loop nest.
// The positions are cut into tiles of kTile = 16 consecutive positions (the last tile may be
// partial; tiles may straddle pages). Two passes over the KV:
//   1. scores: for each tile, its K rows as f32 form a [16, hd] matrix with row stride hd —
//      either the page itself (f32 KV, tile inside one page) or `buf`, where bf16 / fp8 rows
//      are widened once per tile (fp8: value * per-slot scale, bit-identical to
//      fp8_e4m3_to_f32(x) * scale) and the missing rows of a partial tile are zero. For each
//      head h: 16 accumulators acc[t] += q_h[16v..] * K[t][16v..] over the hd/16 chunks v
//      (q chunk in a register, K as memory operand), then ONE transpose-and-add tree
//      (reduce16, score_tile_avx512.h) turns the 16 accumulators into the vector of the
//      tile's 16 scores:
//      sc[h * ns + tile offset + t] = scale * q_h . K_t, ns = n rounded up to 16, so a partial
//      tile writes zeros into the padding.
//   2. softmax per head over sc[h * ns, + n); out (group g) is zeroed.
//   3. P.V: for each tile and each group of at most 8 heads, for each 16-dim chunk v, the
//      heads' output chunks stay in registers across the tile's positions (acc[h] +=
//      p[h][t] * V[t][16v..], p as broadcast memory operand) and are written back once per
//      tile. V rows: bf16 rows of one page are widened in registers; otherwise as f32 like K
//      (page or `buf`).
// Registers: pass 1 uses 16 accumulators + 1 q chunk, pass 3 at most 8 accumulators + 1 V
// chunk, so any head_dim multiple of 16 and any G run without spills. The K / V rows
// kPrefetchTiles tiles ahead are prefetched (see prefetch_rows).
// ---------------------------------------------------------------------------------------

constexpr int64_t kTile = 16;
// Prefetch distance in tiles (docs/bench-log/2026-11-sessions-1-18.md).
constexpr int64_t kPrefetchTiles = 2;

#define AFD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"), always_inline)) inline

// 16 fp8 e4m3 codes -> f32, exactly as fp8_e4m3_to_f32: the sign-extended code shifted left
// by 20 puts the sign at bit 31 and exponent/mantissa at bits 26..20, i.e. an f32 whose value
// is the e4m3 value times 2^-120 (subnormals included); 0x7f / 0xff are NaN.
AFD_AVX512 __m512 fp8x16_to_f32(const uint8_t* p) {
  const __m512i xi = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i bits = _mm512_and_si512(_mm512_slli_epi32(xi, 20), _mm512_set1_epi32(static_cast<int>(0x87F00000u)));
  const __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(xi, _mm512_set1_epi32(0x7f)), _mm512_set1_epi32(0x7f));
  return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(NAN));
}

// Rows [j, j + nb) of one (layer, kv head) of K or V as a [kTile, hd] f32 matrix with row
// stride hd: a pointer into the page when it already is one (f32 KV, the rows in one page,
// nb == kTile), else widened/copied into buf [kTile * hd] with rows nb.. zeroed.
AFD_AVX512 const float* tile_rows(const PagedRows& rows, int64_t j, int64_t nb, float* buf) {
  const int64_t bs = rows.block_size, hd = rows.row_dim, slot0 = j % bs;
  const DType dt = rows.dtype;
  if (dt == DType::f32 && nb == kTile && slot0 + kTile <= bs)
    return reinterpret_cast<const float*>(rows.blocks[j / bs]) + slot0 * hd;
  const int64_t nv = hd / 16;
  for (int64_t t = 0; t < nb; ++t) {
    const int64_t blk = (j + t) / bs, slot = (j + t) % bs;
    const uint8_t* base = rows.blocks[blk];
    const float* scales = rows.scales != nullptr ? rows.scales[blk] : nullptr;
    float* d = buf + t * hd;
    if (dt == DType::bf16) {
      const __m256i* src = reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(base) + slot * hd);
      for (int64_t v = 0; v < nv; ++v)
        _mm512_storeu_ps(d + 16 * v, _mm512_castsi512_ps(_mm512_slli_epi32(
                                         _mm512_cvtepu16_epi32(_mm256_loadu_si256(src + v)), 16)));
    } else if (dt == DType::f32) {
      std::memcpy(d, reinterpret_cast<const float*>(base) + slot * hd, static_cast<size_t>(hd) * 4);
    } else {
      const uint8_t* src = base + slot * hd;
      const __m512 sc = _mm512_set1_ps(scales[slot]);
      for (int64_t v = 0; v < nv; ++v) _mm512_storeu_ps(d + 16 * v, _mm512_mul_ps(fp8x16_to_f32(src + 16 * v), sc));
    }
  }
  if (nb < kTile) std::memset(buf + nb * hd, 0, static_cast<size_t>((kTile - nb) * hd) * 4);
  return buf;
}

// Software prefetch of the rows [j, j + nb) (esz bytes per element) and their fp8 scales: a
// tile covers one page run of one kv head, and consecutive runs of a head are n_kv_heads runs
// apart, so the hardware stream prefetchers restart at every tile.
AFD_AVX512 void prefetch_rows(const PagedRows& rows, int64_t j, int64_t nb, int64_t esz) {
  const int64_t bs = rows.block_size, hd = rows.row_dim;
  for (int64_t t = 0; t < nb; ++t) {
    const uint8_t* base = rows.blocks[(j + t) / bs];
    const float* scales = rows.scales != nullptr ? rows.scales[(j + t) / bs] : nullptr;
    const char* row = reinterpret_cast<const char*>(base) + ((j + t) % bs) * hd * esz;
    for (int64_t b = 0; b < hd * esz; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
    if (scales != nullptr && t == 0) _mm_prefetch(reinterpret_cast<const char*>(scales + (j % bs)), _MM_HINT_T0);
  }
}

// sc[h * ns + t] = scale * q_h . K[t] for the G heads of qg [G, hd] and the kTile rows of K
// (score16: the canonical score order of gqa_attention.h).
AFD_AVX512 void score_tile(const float* K, const float* qg, int64_t G, int64_t hd, float scale, float* sc,
                           int64_t ns) {
  const __m512 vs = _mm512_set1_ps(scale);
  for (int64_t h = 0; h < G; ++h) _mm512_storeu_ps(sc + h * ns, score16(qg + h * hd, K, hd, hd, vs));
}

// o[h][:] += sum_{t < nb} p[h * ns + t] * V[t][:] for GH heads (o rows hd apart, V rows
// stride hd): the GH output chunks stay in registers across the tile's positions. V is f32,
// or (Bf16) the bf16 rows of one page, widened in registers: each V chunk feeds GH FMAs, so
// that is cheaper than a round trip through the tile buffer.
template <int GH, bool Bf16>
AFD_AVX512 void pv_tile(const void* Vp, int64_t nb, int64_t hd, const float* p, int64_t ns, float* o) {
  const int64_t nv = hd / 16;
  for (int64_t v = 0; v < nv; ++v) {
    __m512 acc[GH];
    for (int h = 0; h < GH; ++h) acc[h] = _mm512_loadu_ps(o + h * hd + 16 * v);
    for (int64_t t = 0; t < nb; ++t) {
      __m512 x;
      if constexpr (Bf16) {
        const __m256i r = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(Vp) + t * hd + 16 * v));
        x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(r), 16));
      } else {
        x = _mm512_loadu_ps(static_cast<const float*>(Vp) + t * hd + 16 * v);
      }
      for (int h = 0; h < GH; ++h) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(p[h * ns + t]), x, acc[h]);
    }
    for (int h = 0; h < GH; ++h) _mm512_storeu_ps(o + h * hd + 16 * v, acc[h]);
  }
}

// pv_tile over the G heads in groups of at most 8 (p, o: of head 0).
template <bool Bf16>
AFD_AVX512 void pv_heads(const void* V, int64_t nb, int64_t hd, int64_t G, const float* p, int64_t ns, float* o) {
  for (int64_t h0 = 0; h0 < G; h0 += 8) {
    const float* ph = p + h0 * ns;
    float* oh = o + h0 * hd;
    switch (std::min<int64_t>(8, G - h0)) {
      case 1: pv_tile<1, Bf16>(V, nb, hd, ph, ns, oh); break;
      case 2: pv_tile<2, Bf16>(V, nb, hd, ph, ns, oh); break;
      case 3: pv_tile<3, Bf16>(V, nb, hd, ph, ns, oh); break;
      case 4: pv_tile<4, Bf16>(V, nb, hd, ph, ns, oh); break;
      case 5: pv_tile<5, Bf16>(V, nb, hd, ph, ns, oh); break;
      case 6: pv_tile<6, Bf16>(V, nb, hd, ph, ns, oh); break;
      case 7: pv_tile<7, Bf16>(V, nb, hd, ph, ns, oh); break;
      default: pv_tile<8, Bf16>(V, nb, hd, ph, ns, oh); break;
    }
  }
}

#undef AFD_AVX512

}  // namespace

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))) void gqa_decode_avx512_tiled(
    const float* q, int64_t G, const PagedRows& k, const PagedRows& v, int64_t j0, int64_t n_ctx, float scale,
    float* out, ScratchSlot& scratch) {
  const int64_t hd = k.row_dim, bs = k.block_size;
  const DType dt = k.dtype;
  const int64_t esz = static_cast<int64_t>(dtype_size(dt));
  const int64_t n = n_ctx - j0, ns = (n + kTile - 1) / kTile * kTile;
  constexpr int64_t pf = kPrefetchTiles;
  ScratchSlot::Frame frame(scratch);
  float* scores = scratch.take<float>(static_cast<size_t>(G * ns));
  float* buf = scratch.take<float>(static_cast<size_t>(kTile * hd));
  for (int64_t jb = j0; jb < n_ctx; jb += kTile) {
    if (jb + pf * kTile < n_ctx) prefetch_rows(k, jb + pf * kTile, std::min(kTile, n_ctx - jb - pf * kTile), esz);
    const float* K = tile_rows(k, jb, std::min(kTile, n_ctx - jb), buf);
    score_tile(K, q, G, hd, scale, &scores[jb - j0], ns);
  }
  for (int64_t h = 0; h < G; ++h) {
    softmax(&scores[h * ns], n);
    std::memset(out + h * hd, 0, static_cast<size_t>(hd) * 4);
  }
  for (int64_t jb = j0; jb < n_ctx; jb += kTile) {
    const int64_t nb = std::min(kTile, n_ctx - jb);
    if (jb + pf * kTile < n_ctx) prefetch_rows(v, jb + pf * kTile, std::min(kTile, n_ctx - jb - pf * kTile), esz);
    const float* p = &scores[jb - j0];
    const int64_t slot0 = jb % bs;
    if (dt == DType::bf16 && slot0 + nb <= bs) {  // the tile's rows lie in one page
      pv_heads<true>(v.blocks[jb / bs] + slot0 * hd * 2, nb, hd, G, p, ns, out);
    } else {
      pv_heads<false>(tile_rows(v, jb, nb, buf), nb, hd, G, p, ns, out);
    }
  }
}

}  // namespace afd::kernels::detail
