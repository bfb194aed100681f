// AVX2 + FMA multi-query decode attention (absorbed MLA, MFA; contract:
// mla_attention_kernels.h). v_dim below is the value width (MLA: the latent).
//
// The AVX-512 BF16 kernel's structure in f32: all heads share every key row, so both products
// are small GEMMs with the heads as the vector dimension (8 heads per register; a register tile
// is HV = 2 head vectors x 6 rows, or for head counts that 8-head blocks pad less, HV = 1 x 12
// rows). The context is processed in chunks of kChunk positions with an online softmax:
//   0. the chunk's key rows (and value rows, if separate) are widened exactly to f32 once,
//      Kc[t][d], shared by every head;
//   1. scores S[t][h] = scale * sum_d Qt[d][h] * Kc[t][d]: Qt is q transposed once per call into
//      blocks of 8*HV heads, [Hp/Hb][D][Hb]; Kc values are broadcast; a register tile is
//      12/HV positions x Hb heads;
//   2. per head the running max M, alpha = exp(M_old - M) rescaling the running sum and Ot,
//      P[t][h] = exp(S - M) in place of S;
//   3. Ot[c][h] += sum_t P[t][h] * V[t][c] (Ot in blocks of Hb heads, [Hp/Hb][v_dim][Hb]); a
//      register tile is 12/HV value columns x Hb heads, the V values broadcast.
//   the segment's result (MqaPartial): o[h][c] = Ot[c][h], m = M, l = sum.
// Heads are padded with zero queries to a multiple of Hb; chunk rows past the segment are zero.
// With per-row ends (row_ctx), a lane's positions past its end get P = 0 exactly and do not
// enter its max: its bits are those of a call that stops there (see the AVX-512 kernel).
// Per inner step a tile does 12 FMAs from HV vector loads and 12/HV broadcasts (L1/L2).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/mla_attention_kernels.h"

#define AFD_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace afd::kernels::detail {

namespace {

constexpr int kRows = 12;        // register-tile rows x head vectors (12 accumulators)
constexpr int64_t kChunk = 64;   // positions per online-softmax chunk
constexpr int64_t kChunkPad = 72;  // kChunk rounded up to a multiple of 12/HV for HV = 1, 2

// All-ones in the lanes whose end (lim) lies past position j.
AFD_AVX2 inline __m256 sees(__m256i lim, int64_t j) {
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, _mm256_set1_epi32(static_cast<int>(j))));
}

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
      // e4m3 -> IEEE half exactly (the byte's exponent and mantissa moved into the half's
      // fields, which leaves the value times 2^-8), then times 2^8 * scale: one rounding, the
      // same value as fp8_e4m3_to_f32(x) * scale.
      const uint8_t* p = base + slot * rows.row_dim;
      const float s = rows.scales[blk][slot];
      const __m256 vs = _mm256_set1_ps(s * 256.0f);
      int64_t i = 0;
      for (; i + 8 <= d; i += 8) {
        __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i)));
        h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(static_cast<int16_t>(0xBFFF)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(h), vs));
      }
      for (; i < d; ++i) out[i] = fp8_e4m3_to_f32(p[i]) * s;
    }
  }
}

// The register tiles keep their accumulators in named variables (a<i>0, a<i>1: row i, head
// vectors 0 and 1): GCC keeps an array of vectors in memory across the loop. Rows past the
// tile's count and a<i>1 with HV == 1 are dead code.
#define AFD_TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

// Pass 1 for one register tile of R = 12/HV positions: st[t][0..Hb) (an Hb-head block's scores,
// row stride Hb) from Kc rows kc (row stride D) and the head block's Qt slice qt [D][Hb].
template <int HV>
AFD_AVX2 inline void score_tile(const float* qt, const float* kc, int64_t D, float scale, float* st) {
  constexpr int R = kRows / HV, Hb = 8 * HV;
#define AFD_ZERO(i) __m256 a##i##0 = _mm256_setzero_ps(), a##i##1 = _mm256_setzero_ps();
  AFD_TILE_ROWS(AFD_ZERO)
#undef AFD_ZERO
  for (int64_t d = 0; d < D; ++d) {
    const __m256 q0 = _mm256_loadu_ps(qt + d * Hb);
    const __m256 q1 = HV == 2 ? _mm256_loadu_ps(qt + d * Hb + 8) : q0;
#define AFD_FMA(i)                                           \
  if constexpr ((i) < R) {                                   \
    const __m256 b = _mm256_broadcast_ss(kc + (i) * D + d);  \
    a##i##0 = _mm256_fmadd_ps(q0, b, a##i##0);               \
    if constexpr (HV == 2) a##i##1 = _mm256_fmadd_ps(q1, b, a##i##1); \
  }
    AFD_TILE_ROWS(AFD_FMA)
#undef AFD_FMA
  }
  const __m256 vs = _mm256_set1_ps(scale);
#define AFD_STORE(i)                                                                  \
  if constexpr ((i) < R) {                                                            \
    _mm256_storeu_ps(st + (i) * Hb, _mm256_mul_ps(a##i##0, vs));                      \
    if constexpr (HV == 2) _mm256_storeu_ps(st + (i) * Hb + 8, _mm256_mul_ps(a##i##1, vs)); \
  }
  AFD_TILE_ROWS(AFD_STORE)
#undef AFD_STORE
}

// Pass 3 for one register tile of NC <= 12/HV columns: ot[c][0..Hb) += sum_t p[t][0..Hb) *
// v[t][c] (ot and p row stride Hb, v row stride vs), over n positions.
template <int HV, int NC>
AFD_AVX2 inline void pv_tile(const float* p, const float* v, int64_t vs, int64_t n, float* ot) {
  constexpr int Hb = 8 * HV;
  static_assert(NC >= 1 && NC * HV <= kRows, "at most 12 accumulators");
#define AFD_LOAD(i)                                                         \
  __m256 a##i##0 = _mm256_setzero_ps(), a##i##1 = _mm256_setzero_ps();       \
  if constexpr ((i) < NC) {                                                 \
    a##i##0 = _mm256_loadu_ps(ot + (i) * Hb);                               \
    if constexpr (HV == 2) a##i##1 = _mm256_loadu_ps(ot + (i) * Hb + 8);    \
  }
  AFD_TILE_ROWS(AFD_LOAD)
#undef AFD_LOAD
  for (int64_t t = 0; t < n; ++t) {
    const __m256 p0 = _mm256_loadu_ps(p + t * Hb);
    const __m256 p1 = HV == 2 ? _mm256_loadu_ps(p + t * Hb + 8) : p0;
    const float* vr = v + t * vs;
#define AFD_FMA(i)                                                    \
  if constexpr ((i) < NC) {                                           \
    const __m256 b = _mm256_broadcast_ss(vr + (i));                   \
    a##i##0 = _mm256_fmadd_ps(p0, b, a##i##0);                        \
    if constexpr (HV == 2) a##i##1 = _mm256_fmadd_ps(p1, b, a##i##1); \
  }
    AFD_TILE_ROWS(AFD_FMA)
#undef AFD_FMA
  }
#define AFD_STORE(i)                                                 \
  if constexpr ((i) < NC) {                                          \
    _mm256_storeu_ps(ot + (i) * Hb, a##i##0);                        \
    if constexpr (HV == 2) _mm256_storeu_ps(ot + (i) * Hb + 8, a##i##1); \
  }
  AFD_TILE_ROWS(AFD_STORE)
#undef AFD_STORE
}
#undef AFD_TILE_ROWS

// The last `rem` (< 12/HV) columns: the tile of exactly that width.
template <int HV, int NC>
AFD_AVX2 inline void pv_rest(const float* p, const float* v, int64_t vs, int64_t n, int64_t rem, float* ot) {
  if constexpr (NC >= 1) {
    if (rem == NC) return pv_tile<HV, NC>(p, v, vs, n, ot);
    pv_rest<HV, NC - 1>(p, v, vs, n, rem, ot);
  }
}

template <int HV>
AFD_AVX2 void pv_columns(const float* p, const float* v, int64_t vs, int64_t n, int64_t v_dim, float* ot) {
  constexpr int NC = kRows / HV, Hb = 8 * HV;
  int64_t c = 0;
  for (; c + NC <= v_dim; c += NC) pv_tile<HV, NC>(p, v + c, vs, n, ot + c * Hb);
  pv_rest<HV, NC - 1>(p, v + c, vs, n, v_dim - c, ot + c * Hb);
}

template <int HV>
AFD_AVX2 void decode(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                     int64_t v_dim, int64_t j0, int64_t j1, float scale, const MqaPartial& part, ScratchSlot& scratch,
                     const int64_t* row_ctx) {
  constexpr int64_t Hb = 8 * HV, R = kRows / HV;
  static_assert(kChunkPad % R == 0 && kChunkPad >= kChunk, "chunk padding");
  const int64_t D = k.row_dim, Hp = (n_heads + Hb - 1) / Hb * Hb, nhb = Hp / Hb;
  const bool sep_v = v != nullptr;
  const int64_t VS = sep_v ? v_dim : D;  // row stride of the values in their chunk buffer
  ScratchSlot::Frame frame(scratch);
  float* const qt = scratch.take<float>(static_cast<size_t>(Hp * D));
  float* const kc = scratch.take<float>(static_cast<size_t>(kChunkPad * D));
  float* const vc = sep_v ? scratch.take<float>(static_cast<size_t>(kChunk * v_dim)) : nullptr;
  float* const st = scratch.take<float>(static_cast<size_t>(nhb * kChunkPad * Hb));
  float* const ot = scratch.take<float>(static_cast<size_t>(nhb * v_dim * Hb));
  float* const run_max = scratch.take<float>(static_cast<size_t>(Hp));
  float* const run_sum = scratch.take<float>(static_cast<size_t>(Hp));
  // Per head lane the end of its positions (row_ctx, else j1; padding lanes j1), as int32.
  int32_t* const lim = scratch.take<int32_t>(static_cast<size_t>(Hp));
  for (int64_t h = 0; h < Hp; ++h)
    lim[h] = static_cast<int32_t>(row_ctx != nullptr && h < n_heads ? std::min(row_ctx[h], j1) : j1);
  std::fill(qt, qt + Hp * D, 0.0f);
  std::fill(ot, ot + nhb * v_dim * Hb, 0.0f);
  std::fill(run_max, run_max + Hp, -INFINITY);
  std::fill(run_sum, run_sum + Hp, 0.0f);

  // Qt[h / Hb][d][h % Hb] = q[h][d].
  for (int64_t h = 0; h < n_heads; ++h) {
    float* dst = &qt[(h / Hb) * D * Hb + h % Hb];
    const float* qh = q + h * q_stride;
    for (int64_t d = 0; d < D; ++d) dst[d * Hb] = qh[d];
  }
  const float* vbase = sep_v ? vc : kc;

  for (int64_t c0 = j0; c0 < j1; c0 += kChunk) {
    const int64_t cn = std::min(kChunk, j1 - c0), cpad = (cn + R - 1) / R * R;
    // ---- 0. widen the chunk's rows
    for (int64_t t = 0; t < cn; ++t) widen_row(k, c0 + t, D, &kc[t * D]);
    std::fill(kc + cn * D, kc + cpad * D, 0.0f);
    if (sep_v)
      for (int64_t t = 0; t < cn; ++t) widen_row(*v, c0 + t, v_dim, &vc[t * v_dim]);

    // ---- 1. scores: st[hb][t][Hb]
    for (int64_t t0 = 0; t0 < cpad; t0 += R)
      for (int64_t hb = 0; hb < nhb; ++hb)
        score_tile<HV>(&qt[hb * D * Hb], &kc[t0 * D], D, scale, &st[(hb * kChunkPad + t0) * Hb]);

    // ---- 2. online softmax per 8-head vector
    // A lane past its end (lim) takes no part: the max skips it and its numerator is 0.
    for (int64_t hv = 0; hv < Hp; hv += 8) {
      float* s = &st[((hv / Hb) * kChunkPad) * Hb + hv % Hb];
      const __m256i lv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&lim[hv]));
      const __m256 old = _mm256_loadu_ps(&run_max[hv]);
      __m256 mx = old;
      for (int64_t t = 0; t < cn; ++t) mx = _mm256_blendv_ps(mx, _mm256_max_ps(mx, _mm256_loadu_ps(s + t * Hb)), sees(lv, c0 + t));
      const __m256 a = exp_ps_avx2(_mm256_sub_ps(old, mx));  // first chunk: ~0, sums are 0
      _mm256_storeu_ps(&run_max[hv], mx);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t t = 0; t < cn; ++t) {
        const __m256 e = _mm256_and_ps(sees(lv, c0 + t), exp_ps_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + t * Hb), mx)));
        _mm256_storeu_ps(s + t * Hb, e);
        sum = _mm256_add_ps(sum, e);
      }
      _mm256_storeu_ps(&run_sum[hv], _mm256_fmadd_ps(_mm256_loadu_ps(&run_sum[hv]), a, sum));
      if (c0 > j0) {
        float* o = &ot[(hv / Hb) * v_dim * Hb + hv % Hb];
        for (int64_t c = 0; c < v_dim; ++c) _mm256_storeu_ps(o + c * Hb, _mm256_mul_ps(_mm256_loadu_ps(o + c * Hb), a));
      }
    }

    // ---- 3. Ot += P . V
    for (int64_t hb = 0; hb < nhb; ++hb)
      pv_columns<HV>(&st[hb * kChunkPad * Hb], vbase, VS, cn, v_dim, &ot[hb * v_dim * Hb]);
  }

  // ---- part: o[h][c] = Ot[c][h], m, l
  for (int64_t h = 0; h < n_heads; ++h) {
    float* oh = part.o + h * part.o_stride;
    const float* o = &ot[(h / Hb) * v_dim * Hb + h % Hb];
    for (int64_t c = 0; c < v_dim; ++c) oh[c] = o[c * Hb];
    part.m[h] = run_max[h];
    part.l[h] = run_sum[h];
  }
}

}  // namespace

void mqa_decode_avx2(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                     int64_t v_dim, int64_t j0, int64_t j1, float scale, const MqaPartial& part, ScratchSlot& scratch,
                     const int64_t* row_ctx) {
  // 16-head tiles unless 8-head blocks pad fewer heads (8, 24, 40, ... heads).
  if ((n_heads + 7) / 8 * 8 < (n_heads + 15) / 16 * 16)
    return decode<1>(q, q_stride, n_heads, k, v, v_dim, j0, j1, scale, part, scratch, row_ctx);
  decode<2>(q, q_stride, n_heads, k, v, v_dim, j0, j1, scale, part, scratch, row_ctx);
}

}  // namespace afd::kernels::detail
