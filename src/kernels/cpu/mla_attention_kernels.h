// Internal: the vectorised versions of mqa_decode_attend (mla_attention_avx512.cpp,
// mla_attention_avx2.cpp).
#pragma once

#include <cstdint>

#include "core/scratch_arena.h"
#include "kernels/cpu/mla_attention.h"

namespace afd::kernels::detail {

// Contract of mqa_decode_attend for bf16 rows, k.row_dim even, v_dim % 32 == 0: q and the
// softmax probabilities are rounded to bf16, products accumulate in f32 (vdpbf16ps).
// Positions [j0, j1) of the rows, unnormalised into part (MqaPartial). scratch: the calling
// thread's slot; the transposed bf16 query, a chunk's scores and probabilities, the output tile
// and the running max / sum (O((head_dim + v_dim + 128) * n_heads) values), for the call.
// row_ctx: null, or per query row the end of its positions (mqa_decode_attend), > j0; a
// position at or past a row's end gets probability exactly 0 for that row.
void mqa_decode_avx512_bf16(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                            int64_t v_dim, int64_t j0, int64_t j1, float scale, const MqaPartial& part,
                            ScratchSlot& scratch, const int64_t* row_ctx);

// Contract of mqa_decode_attend for rows of any dtype, on a CPU with AVX2, FMA and F16C: rows
// widened exactly to f32, both products in f32 with f32 accumulation. scratch: the calling
// thread's slot; the transposed query, a chunk's widened rows and scores, the output tile
// (O((head_dim + v_dim) * n_heads + chunk * (head_dim + n_heads)) floats), for the call.
void mqa_decode_avx2(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                     int64_t v_dim, int64_t j0, int64_t j1, float scale, const MqaPartial& part, ScratchSlot& scratch,
                     const int64_t* row_ctx);

}  // namespace afd::kernels::detail
