// Internal: the tiled AVX-512 version of gqa_decode_attend (gqa_attention_avx512.cpp).
#pragma once

#include <cstdint>

#include "core/scratch_arena.h"
#include "kernels/cpu/paged_rows.h"

namespace afd::kernels::detail {

// Contract of gqa_decode_attend on a CPU with AVX-512 F/BW/VL/DQ, head_dim % 16 == 0, rows
// f32, bf16 or f8_e4m3.
void gqa_decode_avx512_tiled(const float* q, int64_t n_heads, const PagedRows& k, const PagedRows& v, int64_t j0,
                             int64_t n_ctx, float scale, float* out, ScratchSlot& scratch);

}  // namespace afd::kernels::detail
