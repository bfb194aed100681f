#include "plan/cost_model.h"

#include <algorithm>

namespace afd::plan {

TokenCost decode_token_cost(const ModelSpec& m, int64_t context) {
  TokenCost t;
  t.context = context;
  const double ctx = static_cast<double>(context);
  for (const auto& g : m.attn) {
    const double n = static_cast<double>(g.n_layers);
    switch (g.kind) {
      case AttnKind::full:
        t.kv_bytes += n * g.kv_bytes_per_token * ctx;
        t.attn_flops += n * g.flops_per_ctx_token * ctx;
        break;
      case AttnKind::chunked: {
        const double len = std::min(ctx, static_cast<double>(g.chunk));
        t.kv_bytes += n * g.kv_bytes_per_token * len;
        t.attn_flops += n * g.flops_per_ctx_token * len;
        break;
      }
      case AttnKind::linear:
        t.kv_bytes += n * g.state_bytes;
        t.attn_flops += n * g.state_flops;
        break;
    }
    t.linear_flops += 2.0 * n * g.linear_params();
  }
  for (const auto& g : m.ffn) t.ffn_flops += 2.0 * static_cast<double>(g.n_layers) * g.active_params();
  return t;
}

Result<UnitCost> unit_cost(const Accelerator& a) {
  if (!a.usd_per_hour) return invalid_argument("accelerator '" + a.id + "' has no price (set usd_per_hour)");
  const double usd_per_s = *a.usd_per_hour / 3600.0;
  return UnitCost{usd_per_s / a.model_flops(), usd_per_s / a.mem_bw};
}

double attention_cost_per_token(const TokenCost& t, const UnitCost& u) {
  return std::max(t.attn_flops * u.usd_per_flop, t.kv_bytes * u.usd_per_byte) + t.linear_flops * u.usd_per_flop;
}

double ffn_cost_per_token(const TokenCost& t, const UnitCost& u) { return t.ffn_flops * u.usd_per_flop; }

CostRow cost_row(const ModelSpec& m, int64_t context, const std::vector<Accelerator>& accs) {
  CostRow r;
  r.model = m.id;
  r.display = m.display;
  r.token = decode_token_cost(m, context);
  for (const auto& a : accs) {
    r.accelerators.push_back(a.id);
    auto u = unit_cost(a);
    if (!u.ok()) {
      r.attn_usd_per_m.push_back(std::nullopt);
      r.ffn_usd_per_m.push_back(std::nullopt);
      continue;
    }
    r.attn_usd_per_m.push_back(1e6 * attention_cost_per_token(r.token, *u));
    r.ffn_usd_per_m.push_back(1e6 * ffn_cost_per_token(r.token, *u));
  }
  // Ties keep the first accelerator in input order.
  int best_a = -1, best_f = -1, best_s = -1;
  for (size_t i = 0; i < accs.size(); ++i) {
    if (!r.attn_usd_per_m[i]) continue;
    const int k = static_cast<int>(i);
    if (best_a < 0 || *r.attn_usd_per_m[i] < *r.attn_usd_per_m[best_a]) best_a = k;
    if (best_f < 0 || *r.ffn_usd_per_m[i] < *r.ffn_usd_per_m[best_f]) best_f = k;
    const double s = *r.attn_usd_per_m[i] + *r.ffn_usd_per_m[i];
    if (best_s < 0 || s < *r.attn_usd_per_m[best_s] + *r.ffn_usd_per_m[best_s]) best_s = k;
  }
  if (best_a >= 0) {
    r.afd_attn = accs[best_a].id;
    r.afd_ffn = accs[best_f].id;
    r.afd_usd_per_m = *r.attn_usd_per_m[best_a] + *r.ffn_usd_per_m[best_f];
    r.single = accs[best_s].id;
    r.single_usd_per_m = *r.attn_usd_per_m[best_s] + *r.ffn_usd_per_m[best_s];
  }
  return r;
}

}  // namespace afd::plan
