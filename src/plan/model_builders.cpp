#include "plan/model_builders.h"

#include <utility>

namespace afd::plan {

AttnGroup make_gqa_group(std::string label, int64_t n_layers, const GqaShape& s, AttnKind kind,
                         int64_t chunk) {
  AttnGroup g;
  g.label = std::move(label);
  g.kind = kind;
  g.n_layers = n_layers;
  g.chunk = chunk;
  const double h = static_cast<double>(s.hidden);
  const double q_dim = static_cast<double>(s.n_heads * s.head_dim);
  const double kv_dim = static_cast<double>(s.n_kv_heads * s.head_dim);
  g.kv_bytes_per_token = 2.0 * kv_dim * s.kv_elem_bytes;
  g.flops_per_ctx_token = 4.0 * q_dim;
  const double q_params = s.q_lora > 0 ? h * s.q_lora + static_cast<double>(s.q_lora) * q_dim : h * q_dim;
  g.other_linear_params = q_params + 2.0 * h * kv_dim;
  g.o_proj_params = q_dim * h;
  return g;
}

AttnGroup make_mla_group(int64_t n_layers, const MlaShape& s) {
  AttnGroup g;
  g.label = "MLA";
  g.kind = AttnKind::full;
  g.n_layers = n_layers;
  const double h = static_cast<double>(s.hidden);
  const double heads = static_cast<double>(s.n_heads);
  const double latent = static_cast<double>(s.kv_lora + s.rope_dim);
  g.kv_bytes_per_token = latent * s.kv_elem_bytes;
  g.flops_per_ctx_token = 2.0 * 2.0 * heads * latent;
  const double qk_head = static_cast<double>(s.nope_dim + s.rope_dim);
  const double q_params = s.q_lora > 0 ? h * s.q_lora + static_cast<double>(s.q_lora) * heads * qk_head
                                       : h * heads * qk_head;
  const double kv_a = h * latent;                                                   // kv_a_proj_with_mqa
  const double kv_b = static_cast<double>(s.kv_lora) * heads * (s.nope_dim + s.v_head_dim);  // absorbed W_UK, W_UV
  g.other_linear_params = q_params + kv_a + kv_b;
  g.o_proj_params = heads * s.v_head_dim * h;
  return g;
}

AttnGroup make_linear_attn_group(int64_t n_layers, const LinearAttnShape& s) {
  AttnGroup g;
  g.label = "linear";
  g.kind = AttnKind::linear;
  g.n_layers = n_layers;
  const double h = static_cast<double>(s.hidden);
  const double d = static_cast<double>(s.head_dim);
  const double heads = static_cast<double>(s.n_heads);
  g.state_bytes = 2.0 * heads * d * d * s.state_elem_bytes;
  g.state_flops = 10.0 * heads * d * d;
  g.other_linear_params = (s.output_gate ? 4.0 : 3.0) * h * heads * d;
  g.o_proj_params = heads * d * h;
  return g;
}

FfnGroup make_dense_ffn(int64_t n_layers, int64_t hidden, int64_t intermediate) {
  FfnGroup g;
  g.label = "dense";
  g.n_layers = n_layers;
  g.shared_params = 3.0 * static_cast<double>(hidden) * static_cast<double>(intermediate);
  return g;
}

FfnGroup make_moe_ffn(int64_t n_layers, int64_t hidden, int64_t d_expert, int64_t n_routed, int64_t top_k,
                      int64_t shared_intermediate) {
  FfnGroup g;
  g.label = "MoE";
  g.n_layers = n_layers;
  g.expert_params = 3.0 * static_cast<double>(hidden) * static_cast<double>(d_expert);
  g.n_routed = n_routed;
  g.top_k = top_k;
  g.shared_params = 3.0 * static_cast<double>(hidden) * static_cast<double>(shared_intermediate);
  return g;
}

}  // namespace afd::plan
