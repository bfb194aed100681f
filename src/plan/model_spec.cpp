#include "plan/model_spec.h"

namespace afd::plan {

const char* attn_kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::full: return "full";
    case AttnKind::chunked: return "chunked";
    case AttnKind::linear: return "linear";
  }
  return "?";
}

const FfnGroup* ModelSpec::first_moe_group() const {
  for (const auto& g : ffn)
    if (g.n_routed > 0) return &g;
  return nullptr;
}

double ModelSpec::moe_sparsity() const {
  const FfnGroup* g = first_moe_group();
  if (g == nullptr || g->total_params() <= 0) return 1.0;
  return g->active_params() / g->total_params();
}

double ModelSpec::shared_expert_units() const {
  const FfnGroup* g = first_moe_group();
  if (g == nullptr || g->expert_params <= 0) return 0.0;
  return g->shared_params / g->expert_params;
}

double ModelSpec::ffn_weight_bytes() const {
  double p = 0;
  for (const auto& g : ffn) p += static_cast<double>(g.n_layers) * g.total_params();
  return p * weight_bytes;
}

double ModelSpec::linear_weight_bytes() const {
  double p = 0;
  for (const auto& g : attn) p += static_cast<double>(g.n_layers) * g.linear_params();
  return p * weight_bytes;
}

}  // namespace afd::plan
