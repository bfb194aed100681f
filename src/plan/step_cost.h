// Work of one decode step of a batch: the per-token model of cost_model.h (the Step-3 paper,
// Tables 2-3) times the batch, plus the two products its tables leave out, the MoE router
// (2 * n_routed * hidden FLOPs per MoE layer and token) and the LM head (2 * vocab * hidden),
// and the bytes the step reads. `afd bench` reports its roofline fractions from this; the
// planner's tables use decode_token_cost. Counting as the planner's builders do
// (plan/model_builders.h): MLA's value product over the whole cached row.
#pragma once

#include <cstdint>

#include "plan/model_spec.h"

namespace afd::plan {

// The weight bytes a step reads, as measured on the loaded model (dtype and scales included):
// what every step reads (attention, norms, router, shared experts, dense FFNs, LM head), and
// one routed expert's weights in one layer, read expert_reads times (the distinct experts the
// routing touched, summed over layers).
struct StepWeightReads {
  double fixed_bytes = 0;
  double routed_expert_bytes = 0;
  int64_t expert_reads = 0;
};

struct StepCost {
  double bytes = 0;            // weights + KV cache read by the step
  double weight_bytes = 0;     // of which weights
  double flops = 0;            // every product: attention + FFN + router + LM head
  double expert_flops = 0;     // routed (top-k) + shared expert products; dense FFNs
  double attention_flops = 0;  // attention projections + core attention
};

// batch sequences at context ctx, one token each. KV bytes: the spec's kv_bytes_per_token
// (its kv_elem_bytes) over the context of every sequence.
StepCost decode_step_cost(const ModelSpec& m, int64_t batch, int64_t ctx, const StepWeightReads& w);

}  // namespace afd::plan
