#include "model/attention_cost.h"

namespace afd {

AttentionCost attention_cost(const ModelConfig& c) {
  AttentionCost a;
  const double hid = static_cast<double>(c.hidden_size);
  const double heads = static_cast<double>(c.n_heads);
  const double q_dim = static_cast<double>(c.q_dim());
  const double q_params = c.q_lora_rank > 0 ? hid * c.q_lora_rank + static_cast<double>(c.q_lora_rank) * q_dim
                                            : hid * q_dim;
  const double o_params = static_cast<double>(c.o_in_dim()) * hid;
  if (c.attention == AttentionKind::mla) {
    const double latent = static_cast<double>(c.kv_lora_rank), rope = static_cast<double>(c.qk_rope_head_dim);
    a.kv_values_per_token = latent + rope;
    a.core_flops_per_ctx_token = 2.0 * heads * (latent + rope) + 2.0 * heads * latent;
    const double kv_b = latent * heads * static_cast<double>(c.qk_nope_head_dim + c.v_head_dim);
    a.projection_params = q_params + hid * (latent + rope) + kv_b + o_params;
  } else {
    const double kv_dim = static_cast<double>(c.kv_dim());
    a.kv_values_per_token = 2.0 * kv_dim;
    a.core_flops_per_ctx_token = 4.0 * heads * static_cast<double>(c.head_dim);
    a.projection_params = q_params + 2.0 * hid * kv_dim + o_params;
  }
  return a;
}

}  // namespace afd
