#include "plan/step_cost.h"

#include "plan/cost_model.h"

namespace afd::plan {

StepCost decode_step_cost(const ModelSpec& m, int64_t batch, int64_t ctx, const StepWeightReads& w) {
  const TokenCost t = decode_token_cost(m, ctx);
  const double b = static_cast<double>(batch);
  double router_flops = 0;
  for (const FfnGroup& g : m.ffn)
    router_flops += 2.0 * static_cast<double>(g.n_layers) * static_cast<double>(g.n_routed) * static_cast<double>(m.hidden);
  const double head_flops = 2.0 * static_cast<double>(m.vocab) * static_cast<double>(m.hidden);
  StepCost s;
  s.attention_flops = b * (t.attn_flops + t.linear_flops);
  s.expert_flops = b * t.ffn_flops;
  s.flops = s.attention_flops + s.expert_flops + b * (router_flops + head_flops);
  s.weight_bytes = w.fixed_bytes + static_cast<double>(w.expert_reads) * w.routed_expert_bytes;
  s.bytes = s.weight_bytes + b * t.kv_bytes;
  return s;
}

}  // namespace afd::plan
