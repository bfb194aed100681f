// Expert selection of MoE layers: router logits -> top-k expert ids and routing weights.
// Runs on the attention side; only ids and weights cross the A->F wire (model/ffn_part.h).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace afd {

// For each of n tokens: logits [n, n_experts] (f32, overwritten with scratch values),
// score_bias [n_experts] or nullptr (noaux_tc's e_score_correction_bias, selection only)
// -> ids [n, k] and weights [n, k], k = c.n_experts_per_tok, following c.scoring,
// c.topk_method, n_group / topk_group, norm_topk_prob and routed_scaling_factor
// (config.h). Ties go to the lower expert id.
void route_tokens(const ModelConfig& c, float* logits, const float* score_bias, int64_t n, int32_t* ids,
                  float* weights);

}  // namespace afd
