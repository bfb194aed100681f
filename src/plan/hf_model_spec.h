// ModelSpec from a Hugging Face config.json (or its "text_config" for multimodal wrappers).
// Supported model_type: deepseek_v3, deepseek_v2, kimi_k2 (MLA); qwen3_moe, qwen2_moe,
// mixtral, ernie4_5_moe, qwen3, qwen2, llama, mistral, ernie4_5 (GQA); step3_text / step3v
// (MFA). Others fail with not_supported naming the type. Quantisation follows the paper's
// default (FP8 weights and KV) unless overridden.
#pragma once

#include <string>

#include "core/status.h"
#include "plan/model_spec.h"

namespace afd::plan {

struct HfSpecOptions {
  double kv_elem_bytes = 1.0;
  double weight_bytes = 1.0;
};

Result<ModelSpec> parse_hf_model_spec(const std::string& json_text, const std::string& source,
                                      const HfSpecOptions& opt = {});
// path: a config.json file or a directory containing one.
Result<ModelSpec> load_hf_model_spec(const std::string& path, const HfSpecOptions& opt = {});

}  // namespace afd::plan
