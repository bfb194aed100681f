// ModelSpec from a Hugging Face config.json. The families the engine serves (qwen3_moe,
// qwen2_moe, mixtral, deepseek_v2, deepseek_v3, kimi_k2, step3_text and step3_vl's
// text_config) are read by the engine's own reader (model/config.h: the same names, defaults
// and checks) and counted from its ModelConfig; the planner reads ernie4_5_moe and the dense
// qwen3, qwen2, llama, mistral, ernie4_5 itself (GQA). Others fail with not_supported naming
// the type. Quantisation follows the paper's default (FP8 weights and KV) unless overridden.
#pragma once

#include <string>

#include "core/status.h"
#include "model/config.h"
#include "plan/model_spec.h"

namespace afd::plan {

struct HfSpecOptions {
  double kv_elem_bytes = 1.0;
  double weight_bytes = 1.0;
};

// The cost model's view of a parsed config: one attention group (MLA, MFA when the query is
// low-rank, else GQA) over every layer; the dense and MoE layers as ModelConfig::is_moe_layer
// says.
ModelSpec model_spec_from_config(const ModelConfig& c, const HfSpecOptions& opt = {});

Result<ModelSpec> parse_hf_model_spec(const std::string& json_text, const std::string& source,
                                      const HfSpecOptions& opt = {});
// path: a config.json file or a directory containing one.
Result<ModelSpec> load_hf_model_spec(const std::string& path, const HfSpecOptions& opt = {});

}  // namespace afd::plan
