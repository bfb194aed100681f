// PagedRows: the view of one head's rows in a sequence's paged KV cache through which the
// decode attention kernels (mla_attention.h, gqa_attention.h) read keys and values.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace afd::kernels {

// Rows of one sequence's paged cache (one head): row j (j < n_ctx) starts at
// blocks[j / block_size] + (j % block_size) * row_dim elements of dtype (f32, bf16 or f8_e4m3);
// fp8 rows are multiplied by scales[j / block_size][j % block_size].
struct PagedRows {
  const uint8_t* const* blocks = nullptr;
  const float* const* scales = nullptr;  // f8_e4m3 only
  int64_t block_size = 0;
  int64_t row_dim = 0;  // values per row (absorbed MLA keys: d_lat + d_rope)
  DType dtype = DType::bf16;
};

// The first d values of row j as f32, widened exactly (fp8: value times the slot's scale).
inline void load_row(const PagedRows& rows, int64_t j, int64_t d, float* out) {
  const int64_t blk = j / rows.block_size, slot = j % rows.block_size, rd = rows.row_dim;
  const uint8_t* base = rows.blocks[blk];
  switch (rows.dtype) {
    case DType::f32: std::memcpy(out, reinterpret_cast<const float*>(base) + slot * rd, static_cast<size_t>(d) * 4); break;
    case DType::bf16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(base) + slot * rd;
      for (int64_t i = 0; i < d; ++i) out[i] = f32_from_bits(static_cast<uint32_t>(p[i]) << 16);
      break;
    }
    default: {
      const uint8_t* p = base + slot * rd;
      const float s = rows.scales[blk][slot];
      for (int64_t i = 0; i < d; ++i) out[i] = fp8_e4m3_to_f32(p[i]) * s;
    }
  }
}

}  // namespace afd::kernels
