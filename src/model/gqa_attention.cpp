#include "model/gqa_attention.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/gqa_attention.h"
#include "model/attention_variant.h"

namespace afd {

void gqa_attend_one(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t n_ctx, int64_t g,
                    const GqaShape& s, const float* q, float* out) {
  thread_local std::vector<const uint8_t*> kb, vb;
  thread_local std::vector<const float*> ks, vs;
  const kernels::PagedRows k = paged_rows(kv, layer, seq, g, /*values=*/false, &kb, &ks);
  const kernels::PagedRows v = paged_rows(kv, layer, seq, g, /*values=*/true, &vb, &vs);
  const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads;
  // Sliding window: only the last s.window positions (HF Mixtral semantics).
  const int64_t j0 = (s.window > 0 && n_ctx > s.window) ? n_ctx - s.window : 0;
  kernels::gqa_decode_attend(q + g * G * hd, G, k, v, j0, n_ctx, 1.0f / std::sqrt(static_cast<float>(hd)),
                             out + g * G * hd);
}

}  // namespace afd
