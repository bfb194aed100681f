#include "plan/hardware_fit.h"

#include <algorithm>
#include <cmath>

namespace afd::plan {

SparsityResult min_moe_sparsity(const Accelerator& a, const ModelSpec& m, const PipelineSpec& p,
                                double nic_efficiency) {
  SparsityResult r;
  r.accelerator = a.id;
  r.net_bw_server = a.net_bw * a.cards_per_server * nic_efficiency;
  r.comm_budget_s = p.stage_s() * 2.0 / 3.0;
  r.min_sparsity = static_cast<double>(m.hidden) * a.model_flops() * static_cast<double>(m.n_layers) /
                   (r.net_bw_server * a.mem_bw * r.comm_budget_s);
  r.model_sparsity = m.moe_sparsity();
  if (const FfnGroup* g = m.first_moe_group()) {
    const double shared = m.shared_expert_units();
    r.min_routed_top_k = (static_cast<double>(g->n_routed) + shared) * r.min_sparsity - shared;
  }
  r.model_ok = r.model_sparsity >= r.min_sparsity;
  return r;
}

AttentionFit attention_fit(const Accelerator& a, const ModelSpec& m, const PipelineSpec& p, int o_proj_tp,
                           int64_t avg_context, std::optional<int64_t> total_batch) {
  AttentionFit f;
  f.layer_budget_s = p.layer_budget_s(m.n_layers);
  f.bytes_in_budget = a.mem_bw * f.layer_budget_s;
  for (const auto& g : m.attn) {
    const double lin = (g.other_linear_params + g.o_proj_params / std::max(1, o_proj_tp)) * m.weight_bytes;
    f.linear_bytes_per_card = std::max(f.linear_bytes_per_card, lin);
    if (g.kind != AttnKind::linear) f.kv_bytes_per_token = std::max(f.kv_bytes_per_token, g.kv_bytes_per_token);
  }
  f.linear_time_fraction = f.linear_bytes_per_card / f.bytes_in_budget;
  f.kv_bytes_budget = f.bytes_in_budget - f.linear_bytes_per_card;
  if (f.kv_bytes_per_token > 0 && f.kv_bytes_budget > 0) {
    f.max_context_tokens = f.kv_bytes_budget / f.kv_bytes_per_token;
    f.max_batch = f.max_context_tokens / static_cast<double>(std::max<int64_t>(1, avg_context));
  }
  f.feasible = f.max_batch >= 1.0;
  if (total_batch && f.feasible) {
    f.cards_for_batch = static_cast<int64_t>(std::ceil(static_cast<double>(*total_batch) / std::floor(f.max_batch)));
  }
  return f;
}

FfnFit ffn_fit(const Accelerator& a, const ModelSpec& m, const PipelineSpec& p, double mem_util) {
  FfnFit f;
  f.layer_budget_s = p.layer_budget_s(m.n_layers);
  f.bytes_per_layer_card = a.mem_bw * mem_util * f.layer_budget_s;
  f.bytes_per_card = f.bytes_per_layer_card * static_cast<double>(m.n_layers);
  f.bytes_per_server = f.bytes_per_card * a.cards_per_server;
  f.ffn_weight_bytes = m.ffn_weight_bytes();
  if (f.bytes_per_card > 0) {
    f.cards_exact = f.ffn_weight_bytes / f.bytes_per_card;
    f.servers = static_cast<int64_t>(std::ceil(f.ffn_weight_bytes / f.bytes_per_server));
    f.cards = f.servers * a.cards_per_server;
  }
  f.fits_memory = f.cards > 0 && a.mem_bytes > 0 && f.ffn_weight_bytes / static_cast<double>(f.cards) <= a.mem_bytes;
  return f;
}

}  // namespace afd::plan
