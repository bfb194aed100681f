#include "model/gqa_attention.h"

#include <cmath>

#include "kernels/cpu/gqa_attention.h"
#include "model/attention_variant.h"

namespace afd {

void gqa_attend_one(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                    const GqaShape& s, const float* q, float* out, ScratchSlot& scratch) {
  ScratchSlot::Frame frame(scratch);
  const size_t n_blocks = kv.block_table(seq).size();
  const uint8_t** blocks = scratch.take<const uint8_t*>(2 * n_blocks);  // K's, then V's
  const float** scales = scratch.take<const float*>(2 * n_blocks);
  const kernels::PagedRows k = paged_rows(kv, layer, seq, g, /*values=*/false, blocks, scales);
  const kernels::PagedRows v = paged_rows(kv, layer, seq, g, /*values=*/true, blocks + n_blocks, scales + n_blocks);
  const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads;
  // Sliding window: only the last s.window positions (HF Mixtral semantics).
  const int64_t j0 = (s.window > 0 && n_ctx > s.window) ? n_ctx - s.window : 0;
  kernels::gqa_decode_attend(q + g * G * hd, G, k, v, j0, n_ctx, 1.0f / std::sqrt(static_cast<float>(hd)),
                             out + g * G * hd, scratch);
}

}  // namespace afd
