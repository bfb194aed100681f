// Internal: the score step shared by the portable decode attention loops (gqa_attention.cpp,
// mla_attention.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/paged_rows.h"

namespace afd::kernels::detail {

inline constexpr int64_t kScoreTile = 16;

// sc[h * sc_stride + t] = scale * q_h . K[j + t] for h < n_heads (q rows q_stride apart) and
// t < nb <= kScoreTile. The rows are widened into rows [kScoreTile, k.row_dim] (rows nb.. zeroed)
// and transposed into kt [k.row_dim, kScoreTile], both the caller's scratch, so each head's
// scores are row_dim broadcast-FMAs into kScoreTile accumulators with no horizontal sums (the
// tile is shared by the heads). Inlined into each caller, compiled for its ISA level.
__attribute__((always_inline)) inline void score_tile(const PagedRows& k, int64_t j, int64_t nb, const float* q,
                                                      int64_t q_stride, int64_t n_heads, float scale, float* rows,
                                                      float* kt, float* sc, int64_t sc_stride) {
  constexpr int64_t kB = kScoreTile;
  const int64_t D = k.row_dim;
  for (int64_t t = 0; t < nb; ++t) load_row(k, j + t, D, &rows[t * D]);
  for (int64_t t = nb; t < kB; ++t) std::memset(&rows[t * D], 0, static_cast<size_t>(D) * 4);
  for (int64_t i = 0; i < D; ++i)
    for (int64_t t = 0; t < kB; ++t) kt[i * kB + t] = rows[t * D + i];
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * q_stride;
    float acc[kB] = {0};
    for (int64_t i = 0; i < D; ++i) {
      const float qi = qh[i];
      for (int64_t t = 0; t < kB; ++t) acc[t] += qi * kt[i * kB + t];
    }
    for (int64_t t = 0; t < nb; ++t) sc[h * sc_stride + t] = acc[t] * scale;
  }
}

}  // namespace afd::kernels::detail
