// AVX-512 BF16 multi-query decode attention (absorbed MLA, MFA; contract:
// mla_attention_kernels.h). d_lat below is the value width (MLA: the latent).
//
// All heads share every key row, so both products are small GEMMs with the heads as the
// vector dimension (16 heads per register, f32 accumulators, vdpbf16ps on bf16 pairs; register
// tiles of Hb = 32 heads, or 16 where that pads the head count less). The
// context is processed in chunks of kChunk positions with an online softmax, so a chunk's
// scores, probabilities and rows stay in L1/L2 between the two products:
//   1. scores S[t][h] = scale * sum_p Qt[p][h] . K[t][pair p]: Qt is q rounded to bf16 and
//      transposed once per call to [D/2 pairs][heads] (32-bit pairs), K pairs are broadcast
//      straight from the cache rows; a register tile is 256 / Hb positions x Hb heads.
//   2. per head the running max M (f32), alpha = exp(M_old - M) rescaling the running sum
//      and Ot, e[t][h] = exp(S - M) rounded to bf16 as position pairs
//      Pp[t/2][h] = (e[t][h], e[t+1][h]), the running sum adding the rounded values.
//   3. Ot[c][h] += sum over position pairs Pp[t/2][h] . (K[t][c], K[t+1][c]): per tile of 32
//      positions the value part of the rows is re-laid as pairs of rows Kp[t/2][c]; a
//      register tile is 256 / Hb latent columns x Hb heads, accumulated in Ot in memory.
//   Each head is one lane: its operations are the same whatever Hb and the other heads.
//   the segment's result (MqaPartial): o[h][c] = Ot[c][h], m = M, l = sum.
// Heads are padded with zero queries to a multiple of Hb, positions past the segment read a
// zero row. With per-row ends (row_ctx), a lane's positions past its end get a numerator of
// exactly 0 and do not enter its max, so its bits are those of a call that stops there: the
// sums add exact zeros, and a chunk wholly past a lane's end leaves its max, so alpha = exp(0)
// = 1 exactly.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/exp_avx512.h"
#include "kernels/cpu/mla_attention_kernels.h"

#define AFD_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))

namespace afd::kernels::detail {

namespace {

constexpr int64_t kPvTile = 32;  // positions per re-laid value tile (pass 3), even
constexpr int64_t kChunk = 128;  // positions per online-softmax chunk, a multiple of kPvTile and 16

inline uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The lanes whose end (lim) lies past position j.
AFD_BF16 inline __mmask16 sees(__m512i lim, int64_t j) {
  return _mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32(static_cast<int>(j)));
}

AFD_BF16 inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// Pass 1's register tile: the scores of the kNt = 16 / HV positions whose rows are r[i] (as
// bf16 pairs) for the 16 HV heads of the transposed query qp ([DP][Hp] pairs, from the tile's
// first head); st[i * Hp + h] = scale * score for i < nt. Kept out of line: its 16 accumulators
// need the vector registers that the caller's live values would otherwise take.
template <int HV>
AFD_BF16 __attribute__((noinline)) void score_tile(const uint32_t* qp, int64_t Hp, int64_t DP, const uint32_t* const* r,
                                                   int nt, __m512 vscale, float* st) {
  constexpr int kNt = 16 / HV;
  __m512 acc[kNt][HV];
  for (int i = 0; i < kNt; ++i)
    for (int u = 0; u < HV; ++u) acc[i][u] = _mm512_setzero_ps();
  for (int64_t p = 0; p < DP; ++p) {
    __m512i qv[HV];
    for (int u = 0; u < HV; ++u) qv[u] = _mm512_loadu_si512(qp + p * Hp + 16 * u);
    for (int i = 0; i < kNt; ++i) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(r[i][p]));
      for (int u = 0; u < HV; ++u) acc[i][u] = dp(acc[i][u], qv[u], b);
    }
  }
  for (int i = 0; i < nt; ++i)
    for (int u = 0; u < HV; ++u) _mm512_storeu_ps(&st[i * Hp + 16 * u], _mm512_mul_ps(acc[i][u], vscale));
}

// Pass 3's register tile: ot[i * Hp + h] += sum over the npairs position pairs tp of
// pt[tp * Hp + h] . kr[tp * d_lat + i] (bf16 pairs) for the kNc = 16 / HV latent columns i and
// the 16 HV heads h from the tile's first. Out of line for the same reason as score_tile.
template <int HV>
AFD_BF16 __attribute__((noinline)) void pv_tile(const uint32_t* pt, const uint32_t* kr, int64_t Hp, int64_t d_lat,
                                                int64_t npairs, float* ot) {
  constexpr int kNc = 16 / HV;
  __m512 acc[kNc][HV];
  for (int i = 0; i < kNc; ++i)
    for (int u = 0; u < HV; ++u) acc[i][u] = _mm512_loadu_ps(&ot[i * Hp + 16 * u]);
  for (int64_t tp = 0; tp < npairs; ++tp) {
    __m512i pv[HV];
    for (int u = 0; u < HV; ++u) pv[u] = _mm512_loadu_si512(pt + tp * Hp + 16 * u);
    const uint32_t* k = kr + tp * d_lat;
    for (int i = 0; i < kNc; ++i) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(k[i]));
      for (int u = 0; u < HV; ++u) acc[i][u] = dp(acc[i][u], pv[u], b);
    }
  }
  for (int i = 0; i < kNc; ++i)
    for (int u = 0; u < HV; ++u) _mm512_storeu_ps(&ot[i * Hp + 16 * u], acc[i][u]);
}

// The kernel for register tiles of HV head vectors (Hb = 16 HV heads): kNt positions (pass 1)
// or kNc latent columns (pass 3) per tile, 16 accumulators either way.
template <int HV>
AFD_BF16 void mqa_bf16_tiles(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& kv, const PagedRows* v,
                             int64_t d_lat, int64_t j0, int64_t j1, float scale, const MqaPartial& part,
                             ScratchSlot& scratch, const int64_t* row_ctx) {
  constexpr int64_t kHb = 16 * HV;
  constexpr int kNt = 16 / HV, kNc = 16 / HV;
  const int64_t D = kv.row_dim, DP = D / 2, Hp = (n_heads + kHb - 1) / kHb * kHb;
  const int64_t bs = kv.block_size;
  const PagedRows& vr = v != nullptr ? *v : kv;
  ScratchSlot::Frame frame(scratch);
  uint32_t* const qt = scratch.take<uint32_t>(static_cast<size_t>(DP * Hp));
  float* const st = scratch.take<float>(static_cast<size_t>(kChunk * Hp));
  uint32_t* const pp = scratch.take<uint32_t>(static_cast<size_t>(kChunk / 2 * Hp));
  uint32_t* const kp = scratch.take<uint32_t>(static_cast<size_t>(kPvTile / 2 * d_lat));
  float* const ot = scratch.take<float>(static_cast<size_t>(d_lat * Hp));
  float* const run_max = scratch.take<float>(static_cast<size_t>(Hp));
  float* const run_sum = scratch.take<float>(static_cast<size_t>(Hp));
  float* const alpha = scratch.take<float>(static_cast<size_t>(Hp));
  uint16_t* const zero_row = scratch.take<uint16_t>(static_cast<size_t>(std::max(D, d_lat)));
  // Per head lane the end of its positions (row_ctx, else j1; padding lanes j1), as int32.
  int32_t* const lim = scratch.take<int32_t>(static_cast<size_t>(Hp));
  for (int64_t h = 0; h < Hp; ++h)
    lim[h] = static_cast<int32_t>(row_ctx != nullptr && h < n_heads ? std::min(row_ctx[h], j1) : j1);
  std::fill(qt, qt + DP * Hp, 0u);
  std::fill(ot, ot + d_lat * Hp, 0.0f);
  std::fill(run_max, run_max + Hp, -INFINITY);
  std::fill(run_sum, run_sum + Hp, 0.0f);
  std::fill(zero_row, zero_row + std::max(D, d_lat), uint16_t{0});

  // Qt[p][h] = (bf16 q[h][2p], bf16 q[h][2p+1]).
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * q_stride;
    for (int64_t p = 0; p < DP; ++p)
      qt[p * Hp + h] = static_cast<uint32_t>(bf16_rne(qh[2 * p])) | (static_cast<uint32_t>(bf16_rne(qh[2 * p + 1])) << 16);
  }
  auto row = [&](int64_t j) -> const uint16_t* {
    if (j >= j1) return zero_row;
    return reinterpret_cast<const uint16_t*>(kv.blocks[j / bs]) + (j % bs) * D;
  };
  auto vrow = [&](int64_t j) -> const uint16_t* {  // the first d_lat values are the value
    if (j >= j1) return zero_row;
    return reinterpret_cast<const uint16_t*>(vr.blocks[j / bs]) + (j % bs) * vr.row_dim;
  };
  const __m512 vscale = _mm512_set1_ps(scale);
  // cvtne2ps_pbh(e1, e0) holds bf16(e0) in elements 0..15 and bf16(e1) in 16..31; this
  // interleaves them to (e0[h], e1[h]) pairs.
  const __m512i pair_idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                            6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54,
                                          22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);

  for (int64_t c0 = j0; c0 < j1; c0 += kChunk) {
    const int64_t cn = std::min(kChunk, j1 - c0);
    const int64_t cpad = (cn + kPvTile - 1) / kPvTile * kPvTile;

    // ---- 1. scores of the chunk: st[t - c0][h]
    for (int64_t t0 = c0; t0 < c0 + cn; t0 += kNt) {
      const uint32_t* r[kNt];
      for (int i = 0; i < kNt; ++i) r[i] = reinterpret_cast<const uint32_t*>(row(t0 + i));
      const int nt = static_cast<int>(std::min<int64_t>(kNt, c0 + cn - t0));
      for (int64_t hb = 0; hb < Hp; hb += kHb) score_tile<HV>(qt + hb, Hp, DP, r, nt, vscale, &st[(t0 - c0) * Hp + hb]);
    }

    // ---- 2. online softmax per head vector: new running max M', alpha = exp(M - M')
    // rescales the sums and Ot so far; numerators e = exp(s - M') as bf16 position pairs
    // (the sums add the rounded values, so the normalisation matches the products).
    // A lane past its end (lim) takes no part: the max skips it and its numerator is 0.
    for (int64_t hv = 0; hv < Hp; hv += 16) {
      const __m512i lv = _mm512_loadu_si512(&lim[hv]);
      __m512 mx = _mm512_loadu_ps(&run_max[hv]);
      const __m512 old = mx;
      for (int64_t t = 0; t < cn; ++t) mx = _mm512_mask_max_ps(mx, sees(lv, c0 + t), mx, _mm512_loadu_ps(&st[t * Hp + hv]));
      const __m512 a = exp_ps(_mm512_sub_ps(old, mx));  // first chunk: exp(-inf) -> ~0, all sums are 0
      _mm512_storeu_ps(&alpha[hv], a);
      _mm512_storeu_ps(&run_max[hv], mx);
      __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(&run_sum[hv]), a);
      for (int64_t t = 0; t < cpad; t += 2) {
        __m512 e0 = _mm512_setzero_ps(), e1 = _mm512_setzero_ps();
        if (t < cn) e0 = _mm512_maskz_mov_ps(sees(lv, c0 + t), exp_ps(_mm512_sub_ps(_mm512_loadu_ps(&st[t * Hp + hv]), mx)));
        if (t + 1 < cn)
          e1 = _mm512_maskz_mov_ps(sees(lv, c0 + t + 1), exp_ps(_mm512_sub_ps(_mm512_loadu_ps(&st[(t + 1) * Hp + hv]), mx)));
        const __m512i b = _mm512_permutexvar_epi16(pair_idx, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
        _mm512_storeu_si512(&pp[t / 2 * Hp + hv], b);
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
        sum = _mm512_add_ps(sum, _mm512_add_ps(lo, hi));
      }
      _mm512_storeu_ps(&run_sum[hv], sum);
    }
    if (c0 > j0) {
      for (int64_t c = 0; c < d_lat; ++c)
        for (int64_t hv = 0; hv < Hp; hv += 16)
          _mm512_storeu_ps(&ot[c * Hp + hv], _mm512_mul_ps(_mm512_loadu_ps(&ot[c * Hp + hv]), _mm512_loadu_ps(&alpha[hv])));
    }

    // ---- 3. Ot[c][h] += Pp . Kp over the chunk's tiles
    for (int64_t t0 = c0; t0 < c0 + cn; t0 += kPvTile) {
      const int64_t npairs = std::min<int64_t>(kPvTile, c0 + cn - t0 + 1) / 2;  // pairs touching the chunk
      for (int64_t tp = 0; tp < npairs; ++tp) {
        const uint16_t* a = vrow(t0 + 2 * tp);
        const uint16_t* b = 2 * tp + 1 < c0 + cn - t0 ? vrow(t0 + 2 * tp + 1) : zero_row;
        uint32_t* dst = kp + tp * d_lat;
        for (int64_t c = 0; c < d_lat; c += 32) {
          const __m512i va = _mm512_loadu_si512(a + c), vb = _mm512_loadu_si512(b + c);
          _mm512_storeu_si512(dst + c, _mm512_permutex2var_epi16(va, lo_idx, vb));
          _mm512_storeu_si512(dst + c + 16, _mm512_permutex2var_epi16(va, hi_idx, vb));
        }
      }
      const uint32_t* pt = pp + (t0 - c0) / 2 * Hp;
      for (int64_t cc = 0; cc < d_lat; cc += kNc) {
        for (int64_t hb = 0; hb < Hp; hb += kHb) pv_tile<HV>(pt + hb, kp + cc, Hp, d_lat, npairs, &ot[cc * Hp + hb]);
      }
    }
  }

  // ---- part: o[h][c] = Ot[c][h], m, l
  for (int64_t h = 0; h < n_heads; ++h) {
    float* oh = part.o + h * part.o_stride;
    for (int64_t c = 0; c < d_lat; ++c) oh[c] = ot[c * Hp + h];
    part.m[h] = run_max[h];
    part.l[h] = run_sum[h];
  }
}

}  // namespace

AFD_BF16 void mqa_decode_avx512_bf16(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& kv,
                                     const PagedRows* v, int64_t d_lat, int64_t j0, int64_t j1, float scale,
                                     const MqaPartial& part, ScratchSlot& scratch, const int64_t* row_ctx) {
  if ((n_heads + 15) / 16 * 16 < (n_heads + 31) / 32 * 32)
    return mqa_bf16_tiles<1>(q, q_stride, n_heads, kv, v, d_lat, j0, j1, scale, part, scratch, row_ctx);
  mqa_bf16_tiles<2>(q, q_stride, n_heads, kv, v, d_lat, j0, j1, scale, part, scratch, row_ctx);
}

}  // namespace afd::kernels::detail
