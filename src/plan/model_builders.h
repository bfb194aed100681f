// Builders for ModelSpec layer groups from architecture hyper-parameters. Each encodes
// one attention design's counting convention (docs/PLANNING.md "Counting conventions").
#pragma once

#include <cstdint>
#include <string>

#include "plan/model_spec.h"

namespace afd::plan {

// GQA / MHA / MQA (and MFA: GQA with a low-rank query, q_lora > 0).
// KV bytes per context token: 2 * n_kv_heads * head_dim * kv_elem_bytes.
// FLOPs per context token: 2 (QK^T) + 2 (PV) FLOPs per head dim per query head.
struct GqaShape {
  int64_t hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t q_lora = 0;          // >0: q = up(norm(down(x))), down: hidden x q_lora, up: q_lora x heads*head_dim
  double kv_elem_bytes = 1.0;  // FP8 = 1, BF16 = 2
};
AttnGroup make_gqa_group(std::string label, int64_t n_layers, const GqaShape& s,
                         AttnKind kind = AttnKind::full, int64_t chunk = 0);

// MLA (DeepSeek-V3 family), counted in the absorbed form used for decoding: the cache
// holds the compressed latent (kv_lora + rope dims); scores and values both run over
// that latent, 2 * 2 * n_heads * (kv_lora + rope) FLOPs per context token.
struct MlaShape {
  int64_t hidden = 0, n_heads = 0, q_lora = 0, kv_lora = 0, rope_dim = 0, nope_dim = 0, v_head_dim = 0;
  double kv_elem_bytes = 1.0;
};
AttnGroup make_mla_group(int64_t n_layers, const MlaShape& s);

// Linear attention (MiniMax lightning): per head a head_dim x head_dim state in
// state_elem_bytes, read and written once per decode token; 10 * n_heads * head_dim^2
// FLOPs per token. Projections q, k, v, output gate (hidden -> heads*head_dim) and o.
struct LinearAttnShape {
  int64_t hidden = 0, n_heads = 0, head_dim = 0;
  double state_elem_bytes = 4.0;
  bool output_gate = true;
};
AttnGroup make_linear_attn_group(int64_t n_layers, const LinearAttnShape& s);

// SwiGLU MLP: 3 * hidden * intermediate weights.
FfnGroup make_dense_ffn(int64_t n_layers, int64_t hidden, int64_t intermediate);
// MoE: n_routed experts of d_expert (SwiGLU), top_k routed per token, plus shared experts of
// total intermediate `shared_intermediate` (0: none).
FfnGroup make_moe_ffn(int64_t n_layers, int64_t hidden, int64_t d_expert, int64_t n_routed,
                      int64_t top_k, int64_t shared_intermediate);

}  // namespace afd::plan
