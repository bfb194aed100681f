// Hardware analysis of the Step-3 paper, §5.3-§6: the minimum MoE sparsity an accelerator needs
// (Table 7) and whether a card meets the per-layer time budget of a 3- or 4-stage AFD
// pipeline at a TPOT target, with the number of attention and FFN cards that follow.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "plan/accelerator.h"
#include "plan/model_spec.h"

namespace afd::plan {

// The AFD pipeline: TPOT target split evenly over n_stages (3: A / comm / F; 4: A / comm /
// F / comm, the Step-3 paper, §3.1 fn. 3), accumulated over all layers.
struct PipelineSpec {
  double tpot_s = 0.050;
  int n_stages = 3;
  double stage_s() const { return tpot_s / n_stages; }
  double layer_budget_s(int64_t n_layers) const { return stage_s() / static_cast<double>(n_layers); }
};

// Step-3 paper, §5.4: S >= H * FLOPs * L / (Net * Bandwidth * t), t = 2/3 of the stage time
// (11.1 ms at 50 ms / 3 stages), Net = NIC bandwidth of one server (net_bw *
// cards_per_server * nic_efficiency), FLOPs and Bandwidth per card.
struct SparsityResult {
  std::string accelerator;
  double net_bw_server = 0;  // bytes/s
  double comm_budget_s = 0;  // the "11.1 ms"
  double min_sparsity = 0;
  // For the model: its sparsity and the routed experts per token it would need on this card,
  // (E + shared) * S_min - shared (the Step-3 paper, §5.4, fn. 6).
  double model_sparsity = 0;
  double min_routed_top_k = 0;
  bool model_ok = false;  // model_sparsity >= min_sparsity
};
SparsityResult min_moe_sparsity(const Accelerator& a, const ModelSpec& m, const PipelineSpec& p,
                                double nic_efficiency = 1.0);

// Step-3 paper, §6, attention side: memory traffic is the necessary condition. In one layer's
// budget the card reads its share of the projection weights (o_proj split over o_proj_tp
// cards, the rest replicated) and the KV cache of its batch.
struct AttentionFit {
  double layer_budget_s = 0;
  double bytes_in_budget = 0;        // mem_bw * layer budget
  double linear_bytes_per_card = 0;  // per layer
  double linear_time_fraction = 0;   // linear bytes / bytes_in_budget
  double kv_bytes_budget = 0;        // per layer, bytes_in_budget - linear bytes (may be < 0)
  double kv_bytes_per_token = 0;     // per layer (largest full-attention group)
  double max_context_tokens = 0;     // summed over the card's batch
  double max_batch = 0;              // at avg_context
  bool feasible = false;             // at least one request of avg_context fits
  std::optional<int64_t> cards_for_batch;  // cards needed for a requested total batch
};
AttentionFit attention_fit(const Accelerator& a, const ModelSpec& m, const PipelineSpec& p, int o_proj_tp,
                           int64_t avg_context, std::optional<int64_t> total_batch = std::nullopt);

// FFN side: at a compute-bound batch the FFN is assumed to use mem_util of the memory
// bandwidth for weights; each card then streams mem_bw * mem_util * layer budget bytes per
// layer, which bounds the FFN weights it can hold.
struct FfnFit {
  double layer_budget_s = 0;
  double bytes_per_layer_card = 0;
  double bytes_per_card = 0;    // all layers
  double bytes_per_server = 0;
  double ffn_weight_bytes = 0;  // whole model
  double cards_exact = 0;       // ffn_weight_bytes / bytes_per_card
  int64_t servers = 0;          // rounded up to whole servers
  int64_t cards = 0;            // servers * cards_per_server
  bool fits_memory = false;     // ffn_weight_bytes / cards <= mem_bytes
};
FfnFit ffn_fit(const Accelerator& a, const ModelSpec& m, const PipelineSpec& p, double mem_util);

}  // namespace afd::plan
