// Multi-query decode attention: for one query token, n_heads heads over one shared key row
// K[j] (and value row V[j]) per position of a paged cache:
//
//   s[h, j] = scale * q[h] . K[j]
//   out[h]  = sum_{j < n_ctx} softmax_j(s[h, :]) * V[j]
//
// Absorbed MLA decode (DeepSeek multi-head latent attention, MODELS.md B4) is the case
// K[j] = c_n[j] (d_lat values: the normalized latent) ‖ k_pe[j] (d_rope values: the rotated
// rope key), q[h] = q_lat[h] ‖ q_pe[h], V[j] = the first d_lat values of K[j]; the caller turns
// q_nope into q_lat = W_UK^T q_nope and out (o_lat) into W_UV o_lat. Step-3's MFA (one K/V head
// of 256 shared by every query head) is the case with separate V rows.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/scratch_arena.h"
#include "kernels/cpu/paged_rows.h"

namespace afd::kernels {

// q: [n_heads, k.row_dim] (f32, row stride q_stride); out: [n_heads, v_dim] (row stride
// out_stride). v: the value rows (row_dim == v_dim, same block_size and dtype as k), or null:
// V[j] = K[j][0 .. v_dim), v_dim <= k.row_dim. n_ctx >= 1. Heads are independent: a caller may
// split them over threads; long contexts are computed in segments (see mqa_decode_segment).
// Dispatch (active_isa): bf16 rows with AVX-512 BF16, k.row_dim even and v_dim % 32 == 0 ->
// q and the probabilities are rounded to bf16 and both products run as bf16 dot products with
// f32 accumulation (vdpbf16ps); otherwise rows are widened exactly to f32 and both products
// run in f32 (an AVX2+FMA register-tiled kernel on AVX2 and AVX-512 CPUs, a portable loop nest
// elsewhere). The softmax is in f32 in every path.
// scratch: the calling thread's slot, for the call: the segments' partials (2 floats per head
// and segment; with several segments v_dim more) and each segment's working memory
// (mqa_decode_segment).
// Thread-safe for distinct outputs and slots.
// row_ctx (optional, n_heads values): query row h sees only positions [0, row_ctx[h]), with
// 1 <= row_ctx[h] <= n_ctx and mqa_decode_segments(row_ctx[h]) == mqa_decode_segments(n_ctx):
// the rows of several consecutive query tokens of one sequence (a speculative verification
// run) in one call, causal among themselves. Row h's output bits are those of a call for that
// row alone with n_ctx = row_ctx[h] (positions past a row's limit get probability exactly 0);
// the rows share every key row the call reads, which fills the vector lanes when a token has
// fewer heads than a register holds.
void mqa_decode_attend(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                       int64_t v_dim, int64_t n_ctx, float scale, float* out, int64_t out_stride, ScratchSlot& scratch,
                       const int64_t* row_ctx = nullptr);

// Absorbed MLA: mqa_decode_attend with q [n_heads, d_lat + d_rope], kv.row_dim == d_lat +
// d_rope, values the first d_lat values of each row, out [n_heads, d_lat].
inline void mla_decode_attend(const float* q, int64_t q_stride, int64_t n_heads, int64_t d_lat, int64_t d_rope,
                              const PagedRows& kv, int64_t n_ctx, float scale, float* out, int64_t out_stride,
                              ScratchSlot& scratch) {
  (void)d_rope;
  mqa_decode_attend(q, q_stride, n_heads, kv, nullptr, d_lat, n_ctx, scale, out, out_stride, scratch);
}

// Split-K form. The context is cut into segments of kMqaSegment positions (the last one
// partial). mqa_decode_attend runs each segment with a fresh online softmax and combines the
// segments in order (mqa_decode_combine); a caller may instead run the segments as separate
// mqa_decode_segment calls (on different threads) and combine them itself: the result is the
// same bits, so it depends on n_ctx and the ISA path only, never on how the work was spread.
inline constexpr int64_t kMqaSegment = 1024;
inline int64_t mqa_decode_segments(int64_t n_ctx) { return (n_ctx + kMqaSegment - 1) / kMqaSegment; }

// One segment's unnormalised result for n_heads heads over its positions j:
//   m[h] = max_j s[h, j],  l[h] = sum_j exp(s[h, j] - m[h]),
//   o[h][c] = sum_j exp(s[h, j] - m[h]) * V[j][c]   (o rows of v_dim values, row stride o_stride).
struct MqaPartial {
  float* o = nullptr;
  int64_t o_stride = 0;
  float* m = nullptr;
  float* l = nullptr;
};

// Segment seg < mqa_decode_segments(n_ctx) (positions [seg * kMqaSegment, min(n_ctx, (seg + 1) *
// kMqaSegment))) of mqa_decode_attend's arguments, into part. Same dispatch as mqa_decode_attend.
// scratch: the calling thread's slot; the kernel's working memory (the transposed query, a
// chunk's rows, scores and output tile: O((k.row_dim + v_dim) * n_heads + kMqaSegment * n_heads)
// floats at most), for the call.
// row_ctx: as for mqa_decode_attend.
void mqa_decode_segment(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                        int64_t v_dim, int64_t n_ctx, int64_t seg, float scale, const MqaPartial& part,
                        ScratchSlot& scratch, const int64_t* row_ctx = nullptr);

// out[h][c] = sum_s w_s[h] * o_s[h][c] / sum_s w_s[h] * l_s[h], w_s[h] = exp(m_s[h] - max_s m_s[h]),
// both sums in segment order s = 0 .. n_parts - 1. out may be parts[0].o (same stride).
// scratch: the calling thread's slot (n_parts floats, for the call).
void mqa_decode_combine(int64_t n_heads, int64_t v_dim, const MqaPartial* parts, int64_t n_parts, float* out,
                        int64_t out_stride, ScratchSlot& scratch);

// Name of the path mqa_decode_attend takes for this dtype ("avx512_bf16_dp", "avx2_f32", "scalar_f32").
const char* mla_decode_path_name(DType kv_dtype);

namespace ref {
// Scalar reference: f32 products over the rows as stored (widened exactly), one head at a time.
void mqa_decode_attend(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                       int64_t v_dim, int64_t n_ctx, float scale, float* out, int64_t out_stride);
inline void mla_decode_attend(const float* q, int64_t q_stride, int64_t n_heads, int64_t d_lat, int64_t d_rope,
                              const PagedRows& kv, int64_t n_ctx, float scale, float* out, int64_t out_stride) {
  (void)d_rope;
  ref::mqa_decode_attend(q, q_stride, n_heads, kv, nullptr, d_lat, n_ctx, scale, out, out_stride);
}
}  // namespace ref

}  // namespace afd::kernels
