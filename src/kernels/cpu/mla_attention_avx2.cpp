// AVX2 + FMA multi-query decode attention (absorbed MLA, MFA; contract:
// mla_attention_kernels.h). v_dim below is the value width (MLA: the latent).
//
// The AVX-512 BF16 kernel's structure in f32: all heads share every key row, so both products
// are small GEMMs with the heads as the vector dimension (8 heads per register, 16 per register
// tile). The context is processed in chunks of kChunk positions with an online softmax:
//   0. the chunk's key rows (and value rows, if separate) are widened exactly to f32 once,
//      Kc[t][d], shared by every head;
//   1. scores S[t][h] = scale * sum_d Qt[d][h] * Kc[t][d]: Qt is q transposed once per call into
//      blocks of 16 heads, [Hp/16][D][16]; Kc values are broadcast; a register tile is
//      kNt positions x 16 heads;
//   2. per head the running max M, alpha = exp(M_old - M) rescaling the running sum and Ot,
//      P[t][h] = exp(S - M) in place of S;
//   3. Ot[c][h] += sum_t P[t][h] * V[t][c] (Ot in blocks of 16 heads, [Hp/16][v_dim][16]); a
//      register tile is kNc value columns x 16 heads, the V values broadcast.
//   out[h][c] = Ot[c][h] / sum[h].
// Heads are padded with zero queries to a multiple of 16; chunk rows past n_ctx are zero.
// Per inner step a tile does 12 FMAs from 2 vector loads and 6 broadcasts, all from L1/L2.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/mla_attention_kernels.h"

#define AFD_AVX2 __attribute__((target("avx2,fma")))

namespace afd::kernels::detail {

namespace {

constexpr int64_t kHb = 16;      // heads per register tile (2 vectors)
constexpr int kNt = 6;           // positions per register tile (pass 1)
constexpr int kNc = 6;           // value columns per register tile (pass 3)
constexpr int64_t kChunk = 64;   // positions per online-softmax chunk
constexpr int64_t kChunkPad = (kChunk + kNt - 1) / kNt * kNt;

// Row j of `rows` widened exactly to f32: its first d values into out[0, d).
AFD_AVX2 void widen_row(const PagedRows& rows, int64_t j, int64_t d, float* out) {
  const int64_t blk = j / rows.block_size, slot = j % rows.block_size;
  const uint8_t* base = rows.blocks[blk];
  switch (rows.dtype) {
    case DType::f32:
      std::memcpy(out, reinterpret_cast<const float*>(base) + slot * rows.row_dim, static_cast<size_t>(d) * 4);
      return;
    case DType::bf16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(base) + slot * rows.row_dim;
      int64_t i = 0;
      for (; i + 8 <= d; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
      }
      for (; i < d; ++i) out[i] = f32_from_bits(static_cast<uint32_t>(p[i]) << 16);
      return;
    }
    default: {
      const uint8_t* p = base + slot * rows.row_dim;
      const float s = rows.scales[blk][slot];
      for (int64_t i = 0; i < d; ++i) out[i] = fp8_e4m3_to_f32(p[i]) * s;
    }
  }
}

// The register tiles below keep their accumulators in named variables (a<i>0, a<i>1: row i,
// heads 0-7 and 8-15): GCC keeps an array of vectors in memory across the loop.
#define AFD_TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

// Pass 1 for one register tile: st[t][0..16) (a 16-head block's scores, row stride kHb) for
// kNt positions from Kc rows kc (row stride D) and the head block's Qt slice qt [D][16].
AFD_AVX2 inline void score_tile(const float* qt, const float* kc, int64_t D, float scale, float* st) {
  static_assert(kNt == 6, "AFD_TILE_ROWS lists kNt rows");
#define AFD_ZERO(i) __m256 a##i##0 = _mm256_setzero_ps(), a##i##1 = _mm256_setzero_ps();
  AFD_TILE_ROWS(AFD_ZERO)
#undef AFD_ZERO
  for (int64_t d = 0; d < D; ++d) {
    const __m256 q0 = _mm256_loadu_ps(qt + d * kHb), q1 = _mm256_loadu_ps(qt + d * kHb + 8);
#define AFD_FMA(i)                                            \
  {                                                           \
    const __m256 b = _mm256_broadcast_ss(kc + (i) * D + d);   \
    a##i##0 = _mm256_fmadd_ps(q0, b, a##i##0);                \
    a##i##1 = _mm256_fmadd_ps(q1, b, a##i##1);                \
  }
    AFD_TILE_ROWS(AFD_FMA)
#undef AFD_FMA
  }
  const __m256 vs = _mm256_set1_ps(scale);
#define AFD_STORE(i)                                               \
  _mm256_storeu_ps(st + (i) * kHb, _mm256_mul_ps(a##i##0, vs));     \
  _mm256_storeu_ps(st + (i) * kHb + 8, _mm256_mul_ps(a##i##1, vs));
  AFD_TILE_ROWS(AFD_STORE)
#undef AFD_STORE
}

// Pass 3 for one register tile: ot[c][0..16) += sum_t p[t][0..16) * v[t][c] for NC <= 6
// columns c (ot row stride kHb, p row stride kHb, v row stride vs), over n positions.
template <int NC>
AFD_AVX2 inline void pv_tile(const float* p, const float* v, int64_t vs, int64_t n, float* ot) {
  static_assert(NC >= 1 && NC <= 6, "AFD_TILE_ROWS lists 6 rows");
#define AFD_LOAD(i)                                                   \
  __m256 a##i##0 = _mm256_setzero_ps(), a##i##1 = _mm256_setzero_ps(); \
  if constexpr ((i) < NC) {                                           \
    a##i##0 = _mm256_loadu_ps(ot + (i) * kHb);                        \
    a##i##1 = _mm256_loadu_ps(ot + (i) * kHb + 8);                    \
  }
  AFD_TILE_ROWS(AFD_LOAD)
#undef AFD_LOAD
  for (int64_t t = 0; t < n; ++t) {
    const __m256 p0 = _mm256_loadu_ps(p + t * kHb), p1 = _mm256_loadu_ps(p + t * kHb + 8);
    const float* vr = v + t * vs;
#define AFD_FMA(i)                                     \
  if constexpr ((i) < NC) {                            \
    const __m256 b = _mm256_broadcast_ss(vr + (i));    \
    a##i##0 = _mm256_fmadd_ps(p0, b, a##i##0);         \
    a##i##1 = _mm256_fmadd_ps(p1, b, a##i##1);         \
  }
    AFD_TILE_ROWS(AFD_FMA)
#undef AFD_FMA
  }
#define AFD_STORE(i)                                \
  if constexpr ((i) < NC) {                         \
    _mm256_storeu_ps(ot + (i) * kHb, a##i##0);      \
    _mm256_storeu_ps(ot + (i) * kHb + 8, a##i##1);  \
  }
  AFD_TILE_ROWS(AFD_STORE)
#undef AFD_STORE
}
#undef AFD_TILE_ROWS

AFD_AVX2 void pv_columns(const float* p, const float* v, int64_t vs, int64_t n, int64_t v_dim, float* ot) {
  int64_t c = 0;
  for (; c + kNc <= v_dim; c += kNc) pv_tile<kNc>(p, v + c, vs, n, ot + c * kHb);
  switch (v_dim - c) {
    case 5: pv_tile<5>(p, v + c, vs, n, ot + c * kHb); break;
    case 4: pv_tile<4>(p, v + c, vs, n, ot + c * kHb); break;
    case 3: pv_tile<3>(p, v + c, vs, n, ot + c * kHb); break;
    case 2: pv_tile<2>(p, v + c, vs, n, ot + c * kHb); break;
    case 1: pv_tile<1>(p, v + c, vs, n, ot + c * kHb); break;
    default: break;
  }
}

}  // namespace

AFD_AVX2 void mqa_decode_avx2(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                              int64_t v_dim, int64_t n_ctx, float scale, float* out, int64_t out_stride) {
  const int64_t D = k.row_dim, Hp = (n_heads + kHb - 1) / kHb * kHb, nhb = Hp / kHb;
  const bool sep_v = v != nullptr;
  const int64_t VS = sep_v ? v_dim : D;  // row stride of the values in their chunk buffer
  thread_local std::vector<float> qt, kc, vc, st, ot, run_max, run_sum;
  qt.assign(static_cast<size_t>(Hp * D), 0.0f);
  kc.resize(static_cast<size_t>(kChunkPad * D));
  if (sep_v) vc.resize(static_cast<size_t>(kChunk * v_dim));
  st.resize(static_cast<size_t>(nhb * kChunkPad * kHb));
  ot.assign(static_cast<size_t>(nhb * v_dim * kHb), 0.0f);
  run_max.assign(static_cast<size_t>(Hp), -INFINITY);
  run_sum.assign(static_cast<size_t>(Hp), 0.0f);

  // Qt[h / 16][d][h % 16] = q[h][d].
  for (int64_t h = 0; h < n_heads; ++h) {
    float* dst = &qt[(h / kHb) * D * kHb + h % kHb];
    const float* qh = q + h * q_stride;
    for (int64_t d = 0; d < D; ++d) dst[d * kHb] = qh[d];
  }
  const float* vbase = sep_v ? vc.data() : kc.data();

  for (int64_t c0 = 0; c0 < n_ctx; c0 += kChunk) {
    const int64_t cn = std::min(kChunk, n_ctx - c0), cpad = (cn + kNt - 1) / kNt * kNt;
    // ---- 0. widen the chunk's rows
    for (int64_t t = 0; t < cn; ++t) widen_row(k, c0 + t, D, &kc[t * D]);
    std::fill(kc.begin() + cn * D, kc.begin() + cpad * D, 0.0f);
    if (sep_v)
      for (int64_t t = 0; t < cn; ++t) widen_row(*v, c0 + t, v_dim, &vc[t * v_dim]);

    // ---- 1. scores: st[hb][t][16]
    for (int64_t t0 = 0; t0 < cpad; t0 += kNt)
      for (int64_t hb = 0; hb < nhb; ++hb)
        score_tile(&qt[hb * D * kHb], &kc[t0 * D], D, scale, &st[(hb * kChunkPad + t0) * kHb]);

    // ---- 2. online softmax per 8-head vector
    for (int64_t hv = 0; hv < Hp; hv += 8) {
      float* s = &st[((hv / kHb) * kChunkPad) * kHb + hv % kHb];
      const __m256 old = _mm256_loadu_ps(&run_max[hv]);
      __m256 mx = old;
      for (int64_t t = 0; t < cn; ++t) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + t * kHb));
      const __m256 a = detail::exp_ps_avx2(_mm256_sub_ps(old, mx));  // first chunk: ~0, sums are 0
      _mm256_storeu_ps(&run_max[hv], mx);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t t = 0; t < cn; ++t) {
        const __m256 e = detail::exp_ps_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + t * kHb), mx));
        _mm256_storeu_ps(s + t * kHb, e);
        sum = _mm256_add_ps(sum, e);
      }
      _mm256_storeu_ps(&run_sum[hv], _mm256_fmadd_ps(_mm256_loadu_ps(&run_sum[hv]), a, sum));
      if (c0 > 0) {
        float* o = &ot[(hv / kHb) * v_dim * kHb + hv % kHb];
        for (int64_t c = 0; c < v_dim; ++c) _mm256_storeu_ps(o + c * kHb, _mm256_mul_ps(_mm256_loadu_ps(o + c * kHb), a));
      }
    }

    // ---- 3. Ot += P . V
    for (int64_t hb = 0; hb < nhb; ++hb)
      pv_columns(&st[hb * kChunkPad * kHb], vbase, VS, cn, v_dim, &ot[hb * v_dim * kHb]);
  }

  // ---- out[h][c] = Ot[c][h] / sum[h]
  for (int64_t h = 0; h < n_heads; ++h) {
    float* oh = out + h * out_stride;
    const float* o = &ot[(h / kHb) * v_dim * kHb + h % kHb];
    const float s = 1.0f / run_sum[h];
    for (int64_t c = 0; c < v_dim; ++c) oh[c] = o[c * kHb] * s;
  }
}

}  // namespace afd::kernels::detail
