// ModelConfig: the fields of a Hugging Face config.json that afd's MoE architectures use.
// Supported model_type values: qwen3_moe, qwen2_moe, mixtral, deepseek_v2, deepseek_v3
// (kimi_k2 reads as deepseek_v3), step3_text (also step3_vl's text_config).
// Facts and sources for the DeepSeek and Step-3 fields: docs/MODELS.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace afd {

enum class Arch { qwen3_moe, qwen2_moe, mixtral, deepseek_v2, deepseek_v3, step3_text };
const char* arch_name(Arch a);
// An arch_name() value -> Arch; false for anything else.
bool arch_from_name(const std::string& name, Arch* out);

// quantization_config of config.json. Only FP8 block quantization is supported
// (DeepSeek-V3 / HF "fp8": quant_method "fp8", fmt "e4m3", activation_scheme "dynamic",
// weight_block_size [128, 128]); its tensors are F8_E4M3 with a float32 `<name>_scale_inv`
// partner (model/matrix.h). Activations are not quantized: dynamic activation quantization
// is optional for a CPU engine (the weights are dequantized on the fly instead).
enum class WeightQuant { none, fp8_block };

// How an attention layer is computed (one implementation each, model/attention_variant.h):
//   gqa: q/k/v projections, n_kv_heads K/V heads of head_dim (Qwen, Mixtral); with
//        q_lora_rank > 0 the query is low-rank: q = wq(rmsnorm(q_proj(x), inter_norm)) —
//        Step-3's MFA (one K/V head shared by all query heads).
//   mla: DeepSeek multi-head latent attention (kv_lora_rank > 0).
enum class AttentionKind { gqa, mla };

// Router scoring and top-k selection (DeepSeek's scoring_func / topk_method):
//   softmax + plain top-k (Qwen, Mixtral, Step-3, DeepSeek-V2 "greedy");
//   softmax + group_limited_greedy (V2: groups ranked by their max prob);
//   sigmoid + noaux_tc (V3: selection on sigmoid + e_score_correction_bias, groups ranked by
//   the sum of their two largest biased scores, other groups masked with -inf; weights are
//   the unbiased sigmoid scores).
// Weights are renormalised iff norm_topk_prob, then multiplied by routed_scaling_factor.
enum class RouterScoring { softmax, sigmoid };
enum class TopkMethod { greedy, group_limited_greedy, noaux_tc };

// rope_scaling of config.json. Only "yarn" (DeepSeek) changes anything; absent/null: none.
struct RopeScaling {
  enum class Type { none, yarn } type = Type::none;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;  // 0: no softmax-scale correction
  bool operator==(const RopeScaling&) const = default;
};

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

  // --- attention variants ---
  AttentionKind attention = AttentionKind::gqa;
  // Low-rank query: MLA q_a_proj -> q_a_layernorm -> q_b_proj; MFA q_proj -> inter_norm -> wq
  // (Step-3 share_q_dim). 0: a direct q projection.
  int64_t q_lora_rank = 0;
  // MLA only (attention == mla): latent width cached per token, per-head non-rotary and
  // rotary q/k dims, per-head value dim. Query/key head width is qk_nope + qk_rope.
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = false;    // RoPE pairs (2i, 2i+1) (DeepSeek) instead of (i, i+d/2)
  RopeScaling rope_scaling;

  // --- routing variants and layer rules ---
  RouterScoring scoring = RouterScoring::softmax;
  TopkMethod topk_method = TopkMethod::greedy;
  int64_t n_group = 1;             // expert groups (DeepSeek n_group); 1: no grouping
  int64_t topk_group = 1;          // groups kept per token
  double routed_scaling_factor = 1.0;
  bool has_score_bias = false;     // e_score_correction_bias tensors (noaux_tc)
  int64_t n_shared_experts = 0;    // DeepSeek: shared width = n_shared_experts * moe_intermediate_size
  // Shared expert output is added unweighted (DeepSeek, Step-3) rather than through a
  // sigmoid gate (qwen2_moe's shared_expert_gate).
  bool shared_expert_ungated = false;
  // DeepSeek: layer l is MoE iff l >= first_k_dense_replace and l % moe_layer_freq == 0.
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  // Step-3 moe_layers_enum: when non-empty, exactly these layers are MoE (overrides the rules
  // above and decoder_sparse_step).
  std::vector<int64_t> moe_layers;
  int64_t num_nextn_predict_layers = 0;  // MTP layers on disk after n_layers (not loaded)

  bool is_moe_layer(int64_t layer) const;
  // Width of one query/key head: head_dim (gqa) or qk_nope + qk_rope (mla).
  int64_t qk_head_dim() const { return attention == AttentionKind::mla ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
  // Width of one value head / attention output head: head_dim (gqa) or v_head_dim (mla).
  int64_t v_dim_per_head() const { return attention == AttentionKind::mla ? v_head_dim : head_dim; }
  int64_t q_dim() const { return n_heads * qk_head_dim(); }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }       // gqa K or V row per token
  int64_t o_in_dim() const { return n_heads * v_dim_per_head(); }  // o_proj input width
  // Checks internal consistency (positive sizes, heads divisible, top-k <= experts, ...).
  Status validate() const;
  // Every field equal (the informational ones too).
  bool operator==(const ModelConfig&) const = default;
};

// The name of the first ModelConfig field (as declared) whose values differ in a and b, or
// nullptr when none does; rope_scaling's fields read "rope_scaling.<field>".
const char* model_config_difference(const ModelConfig& a, const ModelConfig& b);

// Parses config.json text. Errors name the offending field; `source` names the file in messages.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source = "config.json");
// Reads DIR/config.json and, when present, DIR/generation_config.json (eos ids).
Result<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace afd
