// Built-in models: every model of the Step-3 paper, Tables 2-3, with the quantisation the paper
// assumes (§4.1): FP8 weights and FP8 KV everywhere, except BF16 KV for the full-attention
// layers of Llama 4 Maverick and MiniMax M1 and FP32 lightning-attention state for MiniMax M1.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "plan/model_spec.h"

namespace afd::plan {

// All presets in the order of the Step-3 paper, Table 2.
std::vector<ModelSpec> model_presets();
// Looks up a preset by id or alias (case-insensitive): "step3", "deepseek-v3"/"dsv3",
// "kimi-k2", "qwen3-235b-a22b"/"qwen3-moe", "qwen3-32b", "llama4-maverick",
// "minimax-m1", "ernie-4.5-300b-a47b"/"ernie4.5", "pangu-pro-moe".
Result<ModelSpec> find_model_preset(const std::string& name);

}  // namespace afd::plan
