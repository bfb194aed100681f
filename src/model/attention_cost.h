// Decode cost of one attention layer as afd computes it, from the config alone: what
// `afd bench` reports, and what a test compares with the planner's formulas
// (plan/model_builders.cpp) for the same config.
//
//   gqa (incl. MFA): cache 2 * n_kv_heads * head_dim values per token; per context token
//        4 * n_heads * head_dim FLOPs (q.k and p.v);
//   mla (absorbed decode, attention_variant.h): cache kv_lora_rank + qk_rope_head_dim values
//        per token (latent and rotated rope key); per context token
//        2 * n_heads * (kv_lora + rope) FLOPs for the scores and 2 * n_heads * kv_lora for the
//        latent output (the value is the latent part of the cached row only).
// Projection weights count every matrix of the layer's attention (low-rank query included;
// MLA's kv_b once, since the absorbed form applies W_UK and W_UV once per token each).
#pragma once

#include "model/config.h"

namespace afd {

struct AttentionCost {
  double kv_values_per_token = 0;       // KV cache values per context token per layer
  double core_flops_per_ctx_token = 0;  // FLOPs per decode token per context token per layer
  double projection_params = 0;         // attention weights per layer (q path, k/v or kv_a/kv_b, o)
};

AttentionCost attention_cost(const ModelConfig& c);

}  // namespace afd
