// Grouped-query attention of one query token over its sequence's paged KV cache.
#pragma once

#include <cstdint>

#include "core/scratch_arena.h"
#include "kv/paged_kv_cache.h"

namespace afd {

struct GqaShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t window = 0;  // sliding window (Mixtral): attend to the last `window` positions; 0 = all
};

// For the query heads of KV head g (heads [g*G, (g+1)*G), G = n_heads / n_kv_heads):
//   out[h] = sum_{j0 <= j < n_ctx} softmax_j(q[h] . K[j, g] / sqrt(head_dim)) V[j, g]
// with j0 = max(0, n_ctx - window) when a window is set, else 0.
// q, out: [n_heads * head_dim] rows of one token (only group g's heads are read/written).
// K/V positions [0, n_ctx) of `seq` must have been written. scratch: the calling thread's slot.
// Thread-safe for distinct (token, g) and slots.
// The kernel and its paths: kernels::gqa_decode_attend (kernels/cpu/gqa_attention.h).
void gqa_attend_one(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                    const GqaShape& s, const float* q, float* out, ScratchSlot& scratch);

}  // namespace afd
