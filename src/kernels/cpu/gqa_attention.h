// Grouped-query decode attention: the query heads that share one KV head (a GQA group), for one
// query token, over that KV head's rows of a paged cache.
#pragma once

#include <cstdint>

#include "core/scratch_arena.h"
#include "kernels/cpu/paged_rows.h"

namespace afd::kernels {

//   out[h] = sum_{j0 <= j < n_ctx} softmax_j(scale * q[h] . K[j]) V[j],   h < n_heads
// q, out: [n_heads, head_dim] f32 (rows head_dim apart), head_dim = k.row_dim; k, v: the group's
// K and V rows (same row_dim, block_size and dtype: f32, bf16 or f8_e4m3); 0 <= j0 < n_ctx
// (j0 > 0: a sliding window). scratch: the calling thread's slot (working memory of
// O(n_heads * (n_ctx - j0) + 32 * head_dim) floats). Thread-safe for distinct outputs and slots.
//
// Dispatch (the one place GQA decode paths are chosen; CPU features from core/cpu_features.h,
// capped by set_isa_limit / AFD_CPU_DISABLE):
//   1. AVX-512 F/BW/VL, head_dim % 16 == 0 -> the tiled AVX-512 kernel (gqa_attention_avx512.cpp);
//   2. otherwise AVX2 + FMA and j0 == 0 -> the multi-query kernel (mqa_decode_attend, its
//      online softmax over chunks and split-K segments);
//   3. otherwise the loop nest of gqa_attention.cpp compiled for AVX-512, AVX2 + FMA or the
//      baseline ISA.
// Every path computes the scores and the P.V products in f32 from the rows as the cache stores
// them (widened exactly; fp8 times its per-slot scale); 1 and 3 use kernels::softmax. They
// differ only in the f32 summation order (and the exp approximation).
//
// Batch invariance: on every path each head's result is a function of (q_h, the rows j0 ..
// n_ctx - 1, scale, head_dim, dtype, ISA level) only — not of n_heads, the head's place in the
// group, the pool or the other tokens of a batch. Path 1 follows the canonical per-query order
// that kernels::causal_attention's AVX-512 kernel (causal_attention.h) follows too with
// CausalOrder::decode, so a query attended there as part of a prompt run gets the same bits as
// here:
//   scores  s_j = score16 (score_tile_avx512.h): 16 f32 lane partial sums
//           acc[l] = fma(q[16v + l], K_j[16v + l], acc[l]) over v = 0 .. head_dim/16 - 1 from
//           +0, then the fixed tree (Q_0 + Q_1) + (Q_2 + Q_3), Q_k = (acc[4k] + acc[4k+2]) +
//           (acc[4k+1] + acc[4k+3]), then times scale;
//   softmax kernels::softmax over s_j0 .. s_(n_ctx-1) (a contiguous array of n_ctx - j0);
//   P.V     out[h][i] = one fma chain acc = fma(p_j, V_j[i], acc) over j = j0 .. n_ctx - 1 in
//           ascending order, from +0.
void gqa_decode_attend(const float* q, int64_t n_heads, const PagedRows& k, const PagedRows& v, int64_t j0,
                       int64_t n_ctx, float scale, float* out, ScratchSlot& scratch);

// Name of the path gqa_decode_attend takes ("avx512_tiled", "mqa", "loop_avx512", "loop_avx2",
// "loop_portable").
const char* gqa_decode_path_name(int64_t head_dim, int64_t j0);

namespace ref {
// Scalar reference: one head at a time, f32 products over the rows widened exactly, ref::softmax.
void gqa_decode_attend(const float* q, int64_t n_heads, const PagedRows& k, const PagedRows& v, int64_t j0,
                       int64_t n_ctx, float scale, float* out);
}  // namespace ref

}  // namespace afd::kernels
