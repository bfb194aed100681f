#include "model/gqa_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/ops.h"
#include "model/attention_variant.h"

#if defined(__x86_64__)
// GCC 12 reports false -Wmaybe-uninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593), as in kernels/cpu/elementwise_avx512.cpp.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

#define AFD_ALWAYS_INLINE inline __attribute__((always_inline))

// Dispatch (gqa_attend_one, chosen once per process from cpu_features()):
//   AVX-512F/BW/VL and head_dim % 16 == 0, KV bf16 / f32 / fp8 -> attend_avx512_tiled;
//   otherwise AVX2+FMA and no sliding window cutting the context -> the group's heads through
//   the multi-query kernel (kernels::mqa_decode_attend over KV head g's rows);
//   otherwise attend_impl compiled for AVX-512, AVX2+FMA or the baseline ISA
//   (AFD_CPU_DISABLE=avx512 / all force the AVX2 and the portable paths).
// Every path computes the scores and the P.V products in f32 from the KV values as the cache
// stores them (widened exactly; fp8 times its per-slot scale); the softmax is kernels::softmax,
// or for the multi-query kernel its online softmax over chunks and split-K segments. They
// differ only in the f32 summation order (and the exp approximation).
namespace afd {

namespace {

// Converts slot `slot` of a (block, kv head) run to f32. head: the run's first element;
// scales: the run's fp8 scales (one per slot).
AFD_ALWAYS_INLINE void load_head(const uint8_t* head, const float* scales, DType dt, int64_t slot, int64_t hd,
                                 float* out) {
  if (dt == DType::bf16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(head) + slot * hd;
    for (int64_t i = 0; i < hd; ++i) out[i] = f32_from_bits(static_cast<uint32_t>(p[i]) << 16);
  } else if (dt == DType::f32) {
    std::memcpy(out, reinterpret_cast<const float*>(head) + slot * hd, static_cast<size_t>(hd) * 4);
  } else {
    const uint8_t* p = head + slot * hd;
    const float s = scales[slot];
    for (int64_t i = 0; i < hd; ++i) out[i] = fp8_e4m3_to_f32(p[i]) * s;
  }
}

AFD_ALWAYS_INLINE void attend_impl(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                                   const GqaShape& s, const float* q, float* out) {
  const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads, bs = kv.config().block_size;
  const DType dt = kv.config().dtype;
  const bool fp8 = dt == DType::f8_e4m3;
  const auto& table = kv.block_table(seq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  thread_local std::vector<float> scores, row, kt, krows;
  scores.resize(static_cast<size_t>(G * n_ctx));  // [G, n_ctx - j0] used
  row.resize(static_cast<size_t>(hd));
  float* r = row.data();
  const float* qg = q + g * G * hd;
  float* og = out + g * G * hd;
  // Sliding window: only the last s.window positions (HF Mixtral semantics).
  const int64_t j0 = (s.window > 0 && n_ctx > s.window) ? n_ctx - s.window : 0;

  const int64_t n = n_ctx - j0;
  // Scores in blocks of 16 positions: the block's K head rows are widened to f32 and
  // transposed to kt [hd][16], so each head's 16 scores are hd broadcast-FMAs with no
  // horizontal reductions (the block is shared by the G query heads of the group).
  constexpr int64_t kB = 16;
  kt.resize(static_cast<size_t>(hd * kB));
  krows.resize(static_cast<size_t>(hd * kB));
  for (int64_t jb = j0; jb < n_ctx; jb += kB) {
    const int64_t nb = std::min(kB, n_ctx - jb);
    for (int64_t t = 0; t < nb; ++t) {
      const int64_t j = jb + t;
      const int64_t blk = table[j / bs], slot = j % bs;
      load_head(kv.k_head(layer, blk, g), fp8 ? kv.k_scales(layer, blk, g) : nullptr, dt, slot, hd,
                &krows[t * hd]);
    }
    for (int64_t t = nb; t < kB; ++t) std::memset(&krows[t * hd], 0, static_cast<size_t>(hd) * 4);
    for (int64_t i = 0; i < hd; ++i)
      for (int64_t t = 0; t < kB; ++t) kt[i * kB + t] = krows[t * hd + i];
    for (int64_t h = 0; h < G; ++h) {
      const float* qh = qg + h * hd;
      float acc[kB] = {0};
      for (int64_t i = 0; i < hd; ++i) {
        const float qi = qh[i];
        for (int64_t t = 0; t < kB; ++t) acc[t] += qi * kt[i * kB + t];
      }
      for (int64_t t = 0; t < nb; ++t) scores[h * n + (jb + t - j0)] = acc[t] * scale;
    }
  }
  for (int64_t h = 0; h < G; ++h) {
    kernels::softmax(&scores[h * n], n);
    std::memset(og + h * hd, 0, static_cast<size_t>(hd) * 4);
  }
  for (int64_t j = j0; j < n_ctx; ++j) {
    int64_t blk = table[j / bs], slot = j % bs;
    load_head(kv.v_head(layer, blk, g), fp8 ? kv.v_scales(layer, blk, g) : nullptr, dt, slot, hd, r);
    for (int64_t h = 0; h < G; ++h) {
      const float p = scores[h * n + (j - j0)];
      float* oh = og + h * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] += p * r[i];
    }
  }
}

// ---------------------------------------------------------------------------------------
// Tiled AVX-512 kernel (bf16, f32 and fp8 e4m3 KV; head_dim % 16 == 0).
//
// Contract: the same as gqa_attend_one (group g's G = n_heads / n_kv_heads heads, positions
// [j0, n_ctx)); the softmax is kernels::softmax over the f32 scores, as in the other paths.
// The positions are cut into tiles of kTile = 16 consecutive positions (the last tile may be
// partial; tiles may straddle pages). Two passes over the KV:
//   1. scores: for each tile, its K rows as f32 form a [16, hd] matrix with row stride hd —
//      either the page itself (f32 KV, tile inside one page) or `buf`, where bf16 / fp8 rows
//      are widened once per tile (fp8: value * per-slot scale, bit-identical to
//      fp8_e4m3_to_f32(x) * scale) and the missing rows of a partial tile are zero. For each
//      head h: 16 accumulators acc[t] += q_h[16v..] * K[t][16v..] over the hd/16 chunks v
//      (q chunk in a register, K as memory operand), then ONE transpose-and-add tree
//      (reduce16) turns the 16 accumulators into the vector of the tile's 16 scores:
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

// Sums of 16 vectors: lane t of the result = sum of the 16 lanes of a[t]. Pairs are combined
// with 32-bit unpacks, then 64-bit unpacks (each 128-bit lane k now holds the lane-k partial
// sums of 4 consecutive vectors), then two rounds of 128-bit lane shuffles.
AFD_AVX512 __m512 reduce16(const __m512* a) {
  __m512 s2[8], s4[4];
  for (int i = 0; i < 8; ++i)
    s2[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(s2[2 * i]), y = _mm512_castps_pd(s2[2 * i + 1]);
    s4[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(s4[0], s4[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(s4[0], s4[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(s4[2], s4[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(s4[2], s4[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(3, 1, 3, 1)));
}

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
// head(block) -> (run of (block, kv head), its fp8 scales or nullptr).
template <class Head>
AFD_AVX512 const float* tile_rows(const std::vector<int64_t>& table, int64_t bs, int64_t j, int64_t nb, int64_t hd,
                                  DType dt, const Head& head, float* buf) {
  const int64_t slot0 = j % bs;
  if (dt == DType::f32 && nb == kTile && slot0 + kTile <= bs)
    return reinterpret_cast<const float*>(head(table[j / bs]).first) + slot0 * hd;
  const int64_t nv = hd / 16;
  for (int64_t t = 0; t < nb; ++t) {
    const int64_t blk = table[(j + t) / bs], slot = (j + t) % bs;
    const auto [base, scales] = head(blk);
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
template <class Head>
AFD_AVX512 void prefetch_rows(const std::vector<int64_t>& table, int64_t bs, int64_t j, int64_t nb, int64_t hd,
                              int64_t esz, const Head& head) {
  for (int64_t t = 0; t < nb; ++t) {
    const auto [base, scales] = head(table[(j + t) / bs]);
    const char* row = reinterpret_cast<const char*>(base) + ((j + t) % bs) * hd * esz;
    for (int64_t b = 0; b < hd * esz; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
    if (scales != nullptr && t == 0) _mm_prefetch(reinterpret_cast<const char*>(scales + (j % bs)), _MM_HINT_T0);
  }
}

// sc[h * ns + t] = scale * q_h . K[t] for the G heads of qg [G, hd] and the kTile rows of K.
AFD_AVX512 void score_tile(const float* K, const float* qg, int64_t G, int64_t hd, float scale, float* sc,
                           int64_t ns) {
  const int64_t nv = hd / 16;
  for (int64_t h = 0; h < G; ++h) {
    __m512 acc[kTile];
    for (int t = 0; t < kTile; ++t) acc[t] = _mm512_setzero_ps();
    const float* qh = qg + h * hd;
    for (int64_t v = 0; v < nv; ++v) {
      const __m512 qv = _mm512_loadu_ps(qh + 16 * v);
      for (int t = 0; t < kTile; ++t) acc[t] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(K + t * hd + 16 * v), acc[t]);
    }
    _mm512_storeu_ps(sc + h * ns, _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale)));
  }
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

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))) void attend_avx512_tiled(
    const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g, const GqaShape& s,
    const float* q, float* out) {
  const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads, bs = kv.config().block_size;
  const DType dt = kv.config().dtype;
  const bool fp8 = dt == DType::f8_e4m3;
  const int64_t esz = static_cast<int64_t>(dtype_size(dt));
  const auto& table = kv.block_table(seq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t j0 = (s.window > 0 && n_ctx > s.window) ? n_ctx - s.window : 0;
  const int64_t n = n_ctx - j0, ns = (n + kTile - 1) / kTile * kTile;
  constexpr int64_t pf = kPrefetchTiles;
  thread_local std::vector<float> scores, buf;
  scores.resize(static_cast<size_t>(G * ns));
  buf.resize(static_cast<size_t>(kTile * hd));
  const float* qg = q + g * G * hd;
  float* og = out + g * G * hd;
  auto k_head = [&](int64_t blk) {
    return std::pair<const uint8_t*, const float*>(kv.k_head(layer, blk, g), fp8 ? kv.k_scales(layer, blk, g) : nullptr);
  };
  auto v_head = [&](int64_t blk) {
    return std::pair<const uint8_t*, const float*>(kv.v_head(layer, blk, g), fp8 ? kv.v_scales(layer, blk, g) : nullptr);
  };
  for (int64_t jb = j0; jb < n_ctx; jb += kTile) {
    if (jb + pf * kTile < n_ctx)
      prefetch_rows(table, bs, jb + pf * kTile, std::min(kTile, n_ctx - jb - pf * kTile), hd, esz, k_head);
    const float* K = tile_rows(table, bs, jb, std::min(kTile, n_ctx - jb), hd, dt, k_head, buf.data());
    score_tile(K, qg, G, hd, scale, &scores[jb - j0], ns);
  }
  for (int64_t h = 0; h < G; ++h) {
    kernels::softmax(&scores[h * ns], n);
    std::memset(og + h * hd, 0, static_cast<size_t>(hd) * 4);
  }
  for (int64_t jb = j0; jb < n_ctx; jb += kTile) {
    const int64_t nb = std::min(kTile, n_ctx - jb);
    if (jb + pf * kTile < n_ctx)
      prefetch_rows(table, bs, jb + pf * kTile, std::min(kTile, n_ctx - jb - pf * kTile), hd, esz, v_head);
    const float* p = &scores[jb - j0];
    const int64_t slot0 = jb % bs;
    if (dt == DType::bf16 && slot0 + nb <= bs) {  // the tile's rows lie in one page
      pv_heads<true>(kv.v_head(layer, table[jb / bs], g) + slot0 * hd * 2, nb, hd, G, p, ns, og);
    } else {
      pv_heads<false>(tile_rows(table, bs, jb, nb, hd, dt, v_head, buf.data()), nb, hd, G, p, ns, og);
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void attend_avx512(
    const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g, const GqaShape& s,
    const float* q, float* out) {
  attend_impl(kv, layer, seq, n_ctx, g, s, q, out);
}

__attribute__((target("avx2,fma"))) void attend_avx2(const PagedKvCache& kv, int64_t layer, int64_t seq,
                                                     int64_t n_ctx, int64_t g, const GqaShape& s,
                                                     const float* q, float* out) {
  attend_impl(kv, layer, seq, n_ctx, g, s, q, out);
}

void attend_portable(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                     const GqaShape& s, const float* q, float* out) {
  attend_impl(kv, layer, seq, n_ctx, g, s, q, out);
}

}  // namespace

void gqa_attend_one(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                    const GqaShape& s, const float* q, float* out) {
  static const auto impl = [] {
    const CpuFeatures& f = cpu_features();
    if (f.avx512f && f.avx512bw && f.avx512vl) return &attend_avx512;
    if (f.avx2 && f.fma) return &attend_avx2;
    return &attend_portable;
  }();
  static const bool avx512 = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx512f && f.avx512bw && f.avx512vl;
  }();
  static const bool avx2 = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx2 && f.fma;
  }();
  const DType dt = kv.config().dtype;
  if (avx512 && s.head_dim % 16 == 0 && (dt == DType::bf16 || dt == DType::f32 || dt == DType::f8_e4m3)) {
    attend_avx512_tiled(kv, layer, seq, n_ctx, g, s, q, out);
    return;
  }
  if (avx2 && (s.window <= 0 || n_ctx <= s.window)) {
    // The group's G heads over KV head g's rows: the multi-query kernel.
    thread_local std::vector<const uint8_t*> kb, vb;
    thread_local std::vector<const float*> ks, vs;
    const kernels::PagedRows k = paged_rows(kv, layer, seq, g, /*values=*/false, &kb, &ks);
    const kernels::PagedRows v = paged_rows(kv, layer, seq, g, /*values=*/true, &vb, &vs);
    const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads;
    kernels::mqa_decode_attend(q + g * G * hd, hd, G, k, &v, hd, n_ctx, 1.0f / std::sqrt(static_cast<float>(hd)),
                               out + g * G * hd, hd);
    return;
  }
  impl(kv, layer, seq, n_ctx, g, s, q, out);
}

}  // namespace afd
