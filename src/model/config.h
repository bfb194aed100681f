// ModelConfig: the fields of a Hugging Face config.json that afd's MoE architectures use.
// Supported model_type values: qwen3_moe, qwen2_moe, mixtral.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace afd {

enum class Arch { qwen3_moe, qwen2_moe, mixtral };
const char* arch_name(Arch a);
// "qwen3_moe" | "qwen2_moe" | "mixtral" -> Arch; false for anything else.
bool arch_from_name(const std::string& name, Arch* out);

// quantization_config of config.json. Only FP8 block quantization is supported
// (DeepSeek-V3 / HF "fp8": quant_method "fp8", fmt "e4m3", activation_scheme "dynamic",
// weight_block_size [128, 128]); its tensors are F8_E4M3 with a float32 `<name>_scale_inv`
// partner (model/matrix.h). Activations are not quantized: dynamic activation quantization
// is optional for a CPU engine (the weights are dequantized on the fly instead).
enum class WeightQuant { none, fp8_block };

struct ModelConfig {
  Arch arch = Arch::qwen3_moe;
  std::string model_type;          // as in config.json
  std::string architecture;        // architectures[0], e.g. "Qwen3MoeForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;            // num_hidden_layers
  int64_t n_heads = 0;             // num_attention_heads
  int64_t n_kv_heads = 0;          // num_key_value_heads (defaults to n_heads)
  int64_t head_dim = 0;            // head_dim (defaults to hidden_size / n_heads)
  int64_t n_experts = 0;           // num_experts (mixtral: num_local_experts)
  int64_t n_experts_per_tok = 0;   // top-k
  int64_t moe_intermediate_size = 0;      // per routed expert (mixtral: intermediate_size)
  int64_t intermediate_size = 0;          // dense MLP layers (mlp_only_layers / sparse step)
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool norm_topk_prob = false;     // renormalise the top-k softmax weights (mixtral: always true)
  int64_t decoder_sparse_step = 1; // layer l is MoE iff (l+1) % step == 0 and l not in mlp_only_layers
  std::vector<int64_t> mlp_only_layers;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  bool qk_norm = false;            // per-head RMSNorm on q and k before RoPE (qwen3_moe)
  bool attention_bias = false;     // q/k/v projections have bias (qwen2_moe)
  int64_t sliding_window = 0;      // mixtral "sliding_window"; 0: full attention
  std::string torch_dtype;         // informational
  WeightQuant weight_quant = WeightQuant::none;  // quantization_config
  std::string quant_scale_fmt;     // quantization_config.scale_fmt ("ue8m0" or empty), informational
  std::vector<int64_t> eos_token_ids;  // from config.json / generation_config.json
  int64_t bos_token_id = -1;

  bool is_moe_layer(int64_t layer) const;
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Checks internal consistency (positive sizes, heads divisible, top-k <= experts, ...).
  Status validate() const;
};

// Parses config.json text. Errors name the offending field; `source` names the file in messages.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source = "config.json");
// Reads DIR/config.json and, when present, DIR/generation_config.json (eos ids).
Result<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace afd
