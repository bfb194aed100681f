// config.json parsing for qwen3_moe, qwen2_moe, mixtral, deepseek_v2, deepseek_v3 / kimi_k2 and
// step3_text / step3_vl, following the field names and defaults of the Hugging Face
// configuration classes (Qwen3MoeConfig, Qwen2MoeConfig, MixtralConfig, DeepseekV2Config,
// DeepseekV3Config, Step3TextConfig; MODELS.md). Every error names the file and the field.
#include "model/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace afd {

using json = nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::qwen3_moe: return "qwen3_moe";
    case Arch::qwen2_moe: return "qwen2_moe";
    case Arch::mixtral: return "mixtral";
    case Arch::deepseek_v2: return "deepseek_v2";
    case Arch::deepseek_v3: return "deepseek_v3";
    case Arch::step3_text: return "step3_text";
  }
  return "?";
}

bool arch_from_name(const std::string& name, Arch* out) {
  if (name == "qwen3_moe") *out = Arch::qwen3_moe;
  else if (name == "qwen2_moe") *out = Arch::qwen2_moe;
  else if (name == "mixtral") *out = Arch::mixtral;
  else if (name == "deepseek_v2") *out = Arch::deepseek_v2;
  else if (name == "deepseek_v3") *out = Arch::deepseek_v3;
  else if (name == "step3_text") *out = Arch::step3_text;
  else return false;
  return true;
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (n_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (!moe_layers.empty()) return std::find(moe_layers.begin(), moe_layers.end(), layer) != moe_layers.end();
  if (layer < first_k_dense_replace) return false;
  if (moe_layer_freq > 1 && layer % moe_layer_freq != 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

const char* model_config_difference(const ModelConfig& a, const ModelConfig& b) {
#define AFD_FIELD(f) \
  if (!(a.f == b.f)) return #f
  // clang-format off
  AFD_FIELD(arch); AFD_FIELD(model_type); AFD_FIELD(architecture); AFD_FIELD(vocab_size); AFD_FIELD(hidden_size);
  AFD_FIELD(n_layers); AFD_FIELD(n_heads); AFD_FIELD(n_kv_heads); AFD_FIELD(head_dim); AFD_FIELD(n_experts);
  AFD_FIELD(n_experts_per_tok); AFD_FIELD(moe_intermediate_size); AFD_FIELD(intermediate_size);
  AFD_FIELD(shared_expert_intermediate_size); AFD_FIELD(norm_topk_prob); AFD_FIELD(decoder_sparse_step);
  AFD_FIELD(mlp_only_layers); AFD_FIELD(rope_theta); AFD_FIELD(rms_norm_eps); AFD_FIELD(tie_word_embeddings);
  AFD_FIELD(max_position_embeddings); AFD_FIELD(qk_norm); AFD_FIELD(attention_bias); AFD_FIELD(sliding_window);
  AFD_FIELD(torch_dtype); AFD_FIELD(weight_quant); AFD_FIELD(quant_scale_fmt); AFD_FIELD(eos_token_ids);
  AFD_FIELD(bos_token_id); AFD_FIELD(attention); AFD_FIELD(q_lora_rank); AFD_FIELD(kv_lora_rank);
  AFD_FIELD(qk_nope_head_dim); AFD_FIELD(qk_rope_head_dim); AFD_FIELD(v_head_dim); AFD_FIELD(rope_interleave);
  AFD_FIELD(rope_scaling.type); AFD_FIELD(rope_scaling.factor);
  AFD_FIELD(rope_scaling.original_max_position_embeddings); AFD_FIELD(rope_scaling.beta_fast);
  AFD_FIELD(rope_scaling.beta_slow); AFD_FIELD(rope_scaling.mscale); AFD_FIELD(rope_scaling.mscale_all_dim);
  AFD_FIELD(scoring); AFD_FIELD(topk_method); AFD_FIELD(n_group); AFD_FIELD(topk_group);
  AFD_FIELD(routed_scaling_factor); AFD_FIELD(has_score_bias); AFD_FIELD(n_shared_experts);
  AFD_FIELD(shared_expert_ungated); AFD_FIELD(first_k_dense_replace); AFD_FIELD(moe_layer_freq);
  AFD_FIELD(moe_layers); AFD_FIELD(num_nextn_predict_layers);
  // clang-format on
#undef AFD_FIELD
  return a == b ? nullptr : "(a field model_config_difference does not list)";
}

namespace {

// Bounds that keep every size product well inside int64 and reject absurd values early.
constexpr int64_t kMaxDim = int64_t{1} << 24;

Status field_error(const std::string& field, const std::string& what) {
  return invalid_argument("field '" + field + "': " + what);
}

Status check_range(const std::string& field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return field_error(field, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return Status();
}

// Reads typed fields from one JSON object; `null` counts as absent (HF writes null for unset).
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}

  bool has(const char* k) const {
    auto it = j_.find(k);
    return it != j_.end() && !it->is_null();
  }

  Result<int64_t> int_req(const char* k) const {
    if (!has(k)) return field_error(k, "missing (required)");
    return as_int(k, j_.at(k));
  }
  Result<int64_t> int_opt(const char* k, int64_t dflt) const {
    if (!has(k)) return dflt;
    return as_int(k, j_.at(k));
  }
  Result<double> num_opt(const char* k, double dflt) const {
    if (!has(k)) return dflt;
    const json& v = j_.at(k);
    if (!v.is_number()) return field_error(k, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  Result<bool> bool_opt(const char* k, bool dflt) const {
    if (!has(k)) return dflt;
    const json& v = j_.at(k);
    if (!v.is_boolean()) return field_error(k, "expected true/false, got " + v.dump());
    return v.get<bool>();
  }
  Result<std::string> str_opt(const char* k, const std::string& dflt) const {
    if (!has(k)) return dflt;
    const json& v = j_.at(k);
    if (!v.is_string()) return field_error(k, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  // An integer or a list of integers (eos_token_id).
  Result<std::vector<int64_t>> int_list_opt(const char* k) const {
    std::vector<int64_t> out;
    if (!has(k)) return out;
    const json& v = j_.at(k);
    if (v.is_array()) {
      for (const json& e : v) {
        AFD_ASSIGN_OR_RETURN(int64_t x, as_int(k, e));
        out.push_back(x);
      }
    } else {
      AFD_ASSIGN_OR_RETURN(int64_t x, as_int(k, v));
      out.push_back(x);
    }
    return out;
  }
  const json* get(const char* k) const { return has(k) ? &j_.at(k) : nullptr; }
  const json* raw() const { return &j_; }

 private:
  static Result<int64_t> as_int(const char* k, const json& v) {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return field_error(k, "integer " + v.dump() + " is too large");
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    return field_error(k, "expected an integer, got " + v.dump());
  }
  const json& j_;
};

Result<Arch> detect_arch(const Fields& f, ModelConfig* c) {
  AFD_ASSIGN_OR_RETURN(c->model_type, f.str_opt("model_type", ""));
  if (const json* a = f.get("architectures")) {
    if (!a->is_array() || (!a->empty() && !(*a)[0].is_string())) {
      return field_error("architectures", "expected a list of strings, got " + a->dump());
    }
    if (!a->empty()) c->architecture = (*a)[0].get<std::string>();
  }
  Arch arch;
  if (!c->model_type.empty()) {
    if (c->model_type == "kimi_k2") return Arch::deepseek_v3;  // DeepseekV3ForCausalLM layout
    if (!arch_from_name(c->model_type, &arch)) {
      return not_supported("field 'model_type': unknown model_type '" + c->model_type +
                           "' (supported: qwen3_moe, qwen2_moe, mixtral, deepseek_v2, deepseek_v3, kimi_k2, "
                           "step3_text, step3_vl)");
    }
    return arch;
  }
  // No model_type: fall back on architectures[0].
  if (c->architecture == "Qwen3MoeForCausalLM") arch = Arch::qwen3_moe;
  else if (c->architecture == "Qwen2MoeForCausalLM") arch = Arch::qwen2_moe;
  else if (c->architecture == "MixtralForCausalLM") arch = Arch::mixtral;
  else if (c->architecture == "DeepseekV2ForCausalLM") arch = Arch::deepseek_v2;
  else if (c->architecture == "DeepseekV3ForCausalLM") arch = Arch::deepseek_v3;
  else if (c->architecture == "Step3TextForCausalLM") arch = Arch::step3_text;
  else if (c->architecture.empty()) return field_error("model_type", "missing, and no 'architectures' to infer it from");
  else {
    return not_supported("field 'architectures': unknown architecture '" + c->architecture +
                         "' (supported: Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, MixtralForCausalLM, "
                         "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, Step3TextForCausalLM)");
  }
  c->model_type = arch_name(arch);
  return arch;
}

// quantization_config: FP8 block quantization, 128 x 128 blocks (config.h).
Status parse_quantization(const json& q, ModelConfig* c) {
  if (!q.is_object()) return field_error("quantization_config", "expected an object, got " + q.dump());
  Fields f(q);
  AFD_ASSIGN_OR_RETURN(std::string method, f.str_opt("quant_method", ""));
  if (method != "fp8") {
    return not_supported("field 'quantization_config.quant_method': '" + method +
                         "' is not supported (only fp8 block quantization)");
  }
  AFD_ASSIGN_OR_RETURN(std::string fmt, f.str_opt("fmt", "e4m3"));
  if (fmt != "e4m3") return not_supported("field 'quantization_config.fmt': '" + fmt + "' is not supported (only e4m3)");
  AFD_ASSIGN_OR_RETURN(std::string act, f.str_opt("activation_scheme", "dynamic"));
  if (act != "dynamic") {
    return not_supported("field 'quantization_config.activation_scheme': '" + act +
                         "' is not supported (only dynamic; static needs per-tensor input scales)");
  }
  const json* bs = f.get("weight_block_size");
  if (bs == nullptr) {
    return not_supported("field 'quantization_config.weight_block_size': missing (per-tensor FP8 is not "
                         "supported, only [128, 128] blocks)");
  }
  if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() || !(*bs)[1].is_number_integer()) {
    return field_error("quantization_config.weight_block_size", "expected [rows, cols], got " + bs->dump());
  }
  if ((*bs)[0].get<int64_t>() != 128 || (*bs)[1].get<int64_t>() != 128) {
    return not_supported("field 'quantization_config.weight_block_size': " + bs->dump() +
                         " is not supported (only [128, 128])");
  }
  AFD_ASSIGN_OR_RETURN(c->quant_scale_fmt, f.str_opt("scale_fmt", ""));
  if (!c->quant_scale_fmt.empty() && c->quant_scale_fmt != "ue8m0") {
    return not_supported("field 'quantization_config.scale_fmt': '" + c->quant_scale_fmt + "' is not supported");
  }
  c->weight_quant = WeightQuant::fp8_block;
  return Status();
}

// Field names that differ between families, for error messages.
const char* experts_field(Arch a) {
  switch (a) {
    case Arch::mixtral: return "num_local_experts";
    case Arch::deepseek_v2:
    case Arch::deepseek_v3: return "n_routed_experts";
    case Arch::step3_text: return "moe_num_experts";
    default: return "num_experts";
  }
}
const char* topk_field(Arch a) { return a == Arch::step3_text ? "moe_top_k" : "num_experts_per_tok"; }
bool is_deepseek(Arch a) { return a == Arch::deepseek_v2 || a == Arch::deepseek_v3; }

// qwen3_moe, qwen2_moe, mixtral: experts, shared expert and attention extras.
Status parse_qwen_mixtral(const Fields& f, ModelConfig* c) {
  const bool mixtral = c->arch == Arch::mixtral;
  AFD_ASSIGN_OR_RETURN(c->vocab_size, f.int_req("vocab_size"));
  AFD_ASSIGN_OR_RETURN(c->hidden_size, f.int_req("hidden_size"));
  AFD_ASSIGN_OR_RETURN(c->n_layers, f.int_req("num_hidden_layers"));
  AFD_ASSIGN_OR_RETURN(c->n_heads, f.int_req("num_attention_heads"));
  AFD_ASSIGN_OR_RETURN(c->n_kv_heads, f.int_opt("num_key_value_heads", c->n_heads));
  AFD_RETURN_IF_ERROR(check_range("num_attention_heads", c->n_heads, 1, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range("hidden_size", c->hidden_size, 1, kMaxDim));
  AFD_ASSIGN_OR_RETURN(c->head_dim, f.int_opt("head_dim", c->hidden_size / c->n_heads));

  if (mixtral) {
    AFD_ASSIGN_OR_RETURN(c->n_experts, f.int_req("num_local_experts"));
    AFD_ASSIGN_OR_RETURN(c->moe_intermediate_size, f.int_req("intermediate_size"));
    c->intermediate_size = c->moe_intermediate_size;
    c->norm_topk_prob = true;  // softmax over the top-k logits == renormalised top-k softmax
    c->decoder_sparse_step = 1;
    AFD_ASSIGN_OR_RETURN(c->sliding_window, f.int_opt("sliding_window", 0));
  } else {
    AFD_ASSIGN_OR_RETURN(c->n_experts, f.int_req("num_experts"));
    AFD_ASSIGN_OR_RETURN(c->moe_intermediate_size, f.int_req("moe_intermediate_size"));
    AFD_ASSIGN_OR_RETURN(c->intermediate_size, f.int_opt("intermediate_size", 0));
    AFD_ASSIGN_OR_RETURN(c->norm_topk_prob, f.bool_opt("norm_topk_prob", false));
    AFD_ASSIGN_OR_RETURN(c->decoder_sparse_step, f.int_opt("decoder_sparse_step", 1));
    AFD_ASSIGN_OR_RETURN(c->mlp_only_layers, f.int_list_opt("mlp_only_layers"));
    AFD_ASSIGN_OR_RETURN(bool sw, f.bool_opt("use_sliding_window", false));
    if (sw) return not_supported("field 'use_sliding_window': true is not supported");
  }
  AFD_ASSIGN_OR_RETURN(c->n_experts_per_tok, f.int_req("num_experts_per_tok"));

  if (c->arch == Arch::qwen2_moe) {
    // Qwen2MoeSparseMoeBlock always builds its shared expert; 0 here means none.
    AFD_ASSIGN_OR_RETURN(c->shared_expert_intermediate_size, f.int_req("shared_expert_intermediate_size"));
    c->attention_bias = true;  // Qwen2MoeAttention: q/k/v have bias, o does not
    c->qk_norm = false;
  } else if (c->arch == Arch::qwen3_moe) {
    c->shared_expert_intermediate_size = 0;
    c->qk_norm = true;
    AFD_ASSIGN_OR_RETURN(bool bias, f.bool_opt("attention_bias", false));
    if (bias) return not_supported("field 'attention_bias': true (q/k/v/o biases) is not supported for qwen3_moe");
  }
  if (f.has("rope_scaling")) {
    return not_supported("field 'rope_scaling': " + f.get("rope_scaling")->dump() + " is not supported");
  }
  const double theta_default = mixtral ? 1e6 : 10000.0;
  AFD_ASSIGN_OR_RETURN(c->rope_theta, f.num_opt("rope_theta", theta_default));
  if (!f.has("rope_theta") && f.has("rope_parameters")) {  // transformers v5 layout
    const json& rp = *f.get("rope_parameters");
    if (!rp.is_object()) return field_error("rope_parameters", "expected an object, got " + rp.dump());
    Fields r(rp);
    AFD_ASSIGN_OR_RETURN(std::string type, r.str_opt("rope_type", "default"));
    if (type != "default") return not_supported("field 'rope_parameters.rope_type': '" + type + "' is not supported");
    AFD_ASSIGN_OR_RETURN(c->rope_theta, r.num_opt("rope_theta", theta_default));
  }
  AFD_ASSIGN_OR_RETURN(c->rms_norm_eps, f.num_opt("rms_norm_eps", mixtral ? 1e-5 : 1e-6));
  AFD_ASSIGN_OR_RETURN(c->max_position_embeddings, f.int_opt("max_position_embeddings", mixtral ? 4096 * 32 : 32768));
  return Status();
}

// rope_scaling of a DeepSeek config: null/absent, or YaRN (the only type MLA implements).
Status parse_rope_scaling(const Fields& f, ModelConfig* c) {
  const json* rs = f.get("rope_scaling");
  if (rs == nullptr) return Status();
  if (!rs->is_object()) return field_error("rope_scaling", "expected an object or null, got " + rs->dump());
  Fields r(*rs);
  AFD_ASSIGN_OR_RETURN(std::string type, r.str_opt("type", ""));
  if (type.empty()) {
    AFD_ASSIGN_OR_RETURN(type, r.str_opt("rope_type", ""));
  }
  if (type == "default") return Status();
  if (type != "yarn") {
    return not_supported("field 'rope_scaling.type': '" + type + "' is not supported (only yarn)");
  }
  RopeScaling& y = c->rope_scaling;
  y.type = RopeScaling::Type::yarn;
  if (!r.has("factor")) return field_error("rope_scaling.factor", "missing (required for yarn)");
  AFD_ASSIGN_OR_RETURN(y.factor, r.num_opt("factor", 1.0));
  AFD_ASSIGN_OR_RETURN(y.original_max_position_embeddings,
                       r.int_opt("original_max_position_embeddings", c->max_position_embeddings));
  AFD_ASSIGN_OR_RETURN(y.beta_fast, r.num_opt("beta_fast", 32.0));
  AFD_ASSIGN_OR_RETURN(y.beta_slow, r.num_opt("beta_slow", 1.0));
  AFD_ASSIGN_OR_RETURN(y.mscale, r.num_opt("mscale", 1.0));
  AFD_ASSIGN_OR_RETURN(y.mscale_all_dim, r.num_opt("mscale_all_dim", 0.0));
  return Status();
}

// DeepSeek-V2 / V3 (and Kimi-K2): field names and defaults of transformers' DeepseekV2Config /
// DeepseekV3Config and the remote-code scoring_func / topk_method (MODELS.md B1, B8).
Status parse_deepseek(const Fields& f, ModelConfig* c) {
  const bool v3 = c->arch == Arch::deepseek_v3;
  AFD_ASSIGN_OR_RETURN(c->vocab_size, f.int_opt("vocab_size", v3 ? 129280 : 102400));
  AFD_ASSIGN_OR_RETURN(c->hidden_size, f.int_opt("hidden_size", v3 ? 7168 : 4096));
  AFD_ASSIGN_OR_RETURN(c->intermediate_size, f.int_opt("intermediate_size", v3 ? 18432 : 11008));
  AFD_ASSIGN_OR_RETURN(c->moe_intermediate_size, f.int_opt("moe_intermediate_size", v3 ? 2048 : 1407));
  AFD_ASSIGN_OR_RETURN(c->n_layers, f.int_opt("num_hidden_layers", v3 ? 61 : 30));
  AFD_ASSIGN_OR_RETURN(c->n_heads, f.int_opt("num_attention_heads", v3 ? 128 : 32));
  AFD_ASSIGN_OR_RETURN(c->n_kv_heads, f.int_opt("num_key_value_heads", c->n_heads));
  // V2's n_routed_experts / num_experts_per_tok default to None (a dense model): required here.
  if (v3) {
    AFD_ASSIGN_OR_RETURN(c->n_experts, f.int_opt("n_routed_experts", 256));
    AFD_ASSIGN_OR_RETURN(c->n_experts_per_tok, f.int_opt("num_experts_per_tok", 8));
  } else {
    AFD_ASSIGN_OR_RETURN(c->n_experts, f.int_req("n_routed_experts"));
    AFD_ASSIGN_OR_RETURN(c->n_experts_per_tok, f.int_req("num_experts_per_tok"));
  }
  AFD_ASSIGN_OR_RETURN(c->n_shared_experts, f.int_opt("n_shared_experts", v3 ? 1 : 0));
  AFD_RETURN_IF_ERROR(check_range("n_shared_experts", c->n_shared_experts, 0, 64));
  AFD_RETURN_IF_ERROR(check_range("moe_intermediate_size", c->moe_intermediate_size, 1, kMaxDim));
  c->shared_expert_intermediate_size = c->n_shared_experts * c->moe_intermediate_size;
  c->shared_expert_ungated = true;
  AFD_ASSIGN_OR_RETURN(c->routed_scaling_factor, f.num_opt("routed_scaling_factor", v3 ? 2.5 : 1.0));
  AFD_ASSIGN_OR_RETURN(c->n_group, f.int_opt("n_group", v3 ? 8 : 1));
  AFD_ASSIGN_OR_RETURN(c->topk_group, f.int_opt("topk_group", v3 ? 4 : 1));
  AFD_ASSIGN_OR_RETURN(c->first_k_dense_replace, f.int_opt("first_k_dense_replace", v3 ? 3 : 0));
  AFD_ASSIGN_OR_RETURN(c->moe_layer_freq, f.int_opt("moe_layer_freq", 1));
  AFD_ASSIGN_OR_RETURN(c->norm_topk_prob, f.bool_opt("norm_topk_prob", v3));
  AFD_ASSIGN_OR_RETURN(std::string scoring, f.str_opt("scoring_func", v3 ? "sigmoid" : "softmax"));
  if (scoring == "softmax") c->scoring = RouterScoring::softmax;
  else if (scoring == "sigmoid") c->scoring = RouterScoring::sigmoid;
  else return not_supported("field 'scoring_func': '" + scoring + "' is not supported (softmax, sigmoid)");
  AFD_ASSIGN_OR_RETURN(std::string method, f.str_opt("topk_method", v3 ? "noaux_tc" : "greedy"));
  if (method == "greedy") c->topk_method = TopkMethod::greedy;
  else if (method == "group_limited_greedy") c->topk_method = TopkMethod::group_limited_greedy;
  else if (method == "noaux_tc") c->topk_method = TopkMethod::noaux_tc;
  else {
    return not_supported("field 'topk_method': '" + method +
                         "' is not supported (greedy, group_limited_greedy, noaux_tc)");
  }
  c->has_score_bias = c->topk_method == TopkMethod::noaux_tc;

  // MLA. q_lora_rank: null means a direct q_proj (V2-Lite); absent means the class default.
  c->attention = AttentionKind::mla;
  const json& j = *f.raw();
  if (j.contains("q_lora_rank") && j.at("q_lora_rank").is_null()) {
    c->q_lora_rank = 0;
  } else {
    AFD_ASSIGN_OR_RETURN(c->q_lora_rank, f.int_opt("q_lora_rank", 1536));
  }
  if (j.contains("q_lora_rank") && !j.at("q_lora_rank").is_null() && c->q_lora_rank == 0)
    return field_error("q_lora_rank", "0 is not a rank (use null for a direct q_proj)");
  AFD_ASSIGN_OR_RETURN(c->kv_lora_rank, f.int_opt("kv_lora_rank", 512));
  AFD_ASSIGN_OR_RETURN(c->qk_nope_head_dim, f.int_opt("qk_nope_head_dim", 128));
  AFD_ASSIGN_OR_RETURN(c->qk_rope_head_dim, f.int_opt("qk_rope_head_dim", 64));
  AFD_ASSIGN_OR_RETURN(c->v_head_dim, f.int_opt("v_head_dim", 128));
  AFD_RETURN_IF_ERROR(check_range("qk_nope_head_dim", c->qk_nope_head_dim, 1, 4096));
  AFD_RETURN_IF_ERROR(check_range("qk_rope_head_dim", c->qk_rope_head_dim, 2, 4096));
  // head_dim is the query/key head width (qk_nope + qk_rope) for MLA; config.json's head_dim
  // (transformers writes qk_rope_head_dim there) is not used.
  c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
  AFD_ASSIGN_OR_RETURN(c->rope_interleave, f.bool_opt("rope_interleave", true));
  AFD_ASSIGN_OR_RETURN(c->num_nextn_predict_layers, f.int_opt("num_nextn_predict_layers", 0));

  AFD_ASSIGN_OR_RETURN(bool bias, f.bool_opt("attention_bias", false));
  if (bias) return not_supported("field 'attention_bias': true (q/k/v/o biases) is not supported for deepseek");
  AFD_ASSIGN_OR_RETURN(c->rope_theta, f.num_opt("rope_theta", 10000.0));
  AFD_ASSIGN_OR_RETURN(c->rms_norm_eps, f.num_opt("rms_norm_eps", 1e-6));
  AFD_ASSIGN_OR_RETURN(c->max_position_embeddings, f.int_opt("max_position_embeddings", v3 ? 4096 : 2048));
  return parse_rope_scaling(f, c);
}

// "4,5,...,59" (comma-separated, spaces allowed) or a list of integers -> layer indices.
Result<std::vector<int64_t>> parse_layer_enum(const char* field, const json& v) {
  std::vector<int64_t> out;
  if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_number_integer()) return field_error(field, "expected integers, got " + e.dump());
      out.push_back(e.get<int64_t>());
    }
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    size_t i = 0;
    while (i <= s.size()) {
      size_t comma = s.find(',', i);
      if (comma == std::string::npos) comma = s.size();
      std::string item = s.substr(i, comma - i);
      const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
      item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
      if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos)
        return field_error(field, "'" + item + "' in \"" + s + "\" is not a layer index");
      out.push_back(std::stoll(item));
      i = comma + 1;
    }
  } else {
    return field_error(field, "expected a comma-separated string or a list of integers, got " + v.dump());
  }
  if (out.empty()) return field_error(field, "empty");
  return out;
}

// Step-3 text model (step3_text, or step3_vl's text_config): Step3TextConfig's names and
// defaults (MODELS.md A1). MFA = GQA with one K/V head and a low-rank query.
Status parse_step3(const Fields& f, ModelConfig* c) {
  AFD_ASSIGN_OR_RETURN(c->vocab_size, f.int_opt("vocab_size", 128815));
  AFD_ASSIGN_OR_RETURN(c->hidden_size, f.int_opt("hidden_size", 7168));
  AFD_ASSIGN_OR_RETURN(c->intermediate_size, f.int_opt("intermediate_size", 18432));
  AFD_ASSIGN_OR_RETURN(c->n_layers, f.int_opt("num_hidden_layers", 61));
  AFD_ASSIGN_OR_RETURN(c->n_heads, f.int_opt("num_attention_heads", 64));
  AFD_ASSIGN_OR_RETURN(c->n_kv_heads, f.int_opt("num_attention_groups", 1));
  if (c->n_kv_heads != 1) {
    return not_supported("field 'num_attention_groups': " + std::to_string(c->n_kv_heads) +
                         " is not supported (Step-3 MFA has one K/V head)");
  }
  AFD_ASSIGN_OR_RETURN(c->head_dim, f.int_opt("head_dim", 256));
  AFD_ASSIGN_OR_RETURN(c->q_lora_rank, f.int_opt("share_q_dim", 2048));
  AFD_RETURN_IF_ERROR(check_range("share_q_dim", c->q_lora_rank, 1, kMaxDim));
  AFD_ASSIGN_OR_RETURN(c->n_experts, f.int_opt("moe_num_experts", 48));
  AFD_ASSIGN_OR_RETURN(c->n_experts_per_tok, f.int_opt("moe_top_k", 3));
  AFD_ASSIGN_OR_RETURN(c->moe_intermediate_size, f.int_opt("moe_intermediate_size", 5120));
  AFD_ASSIGN_OR_RETURN(c->shared_expert_intermediate_size, f.int_opt("share_expert_dim", 5120));
  AFD_RETURN_IF_ERROR(check_range("share_expert_dim", c->shared_expert_intermediate_size, 0, kMaxDim));
  c->n_shared_experts = c->shared_expert_intermediate_size > 0 ? 1 : 0;
  c->shared_expert_ungated = true;
  AFD_ASSIGN_OR_RETURN(c->norm_topk_prob, f.bool_opt("norm_expert_weight", false));
  AFD_RETURN_IF_ERROR(check_range("num_hidden_layers", c->n_layers, 1, 4096));
  if (const json* e = f.get("moe_layers_enum")) {
    AFD_ASSIGN_OR_RETURN(c->moe_layers, parse_layer_enum("moe_layers_enum", *e));
  } else {
    c->first_k_dense_replace = 1;  // vLLM / SGLang: every layer but layer 0 is MoE
  }
  if (f.has("rope_scaling")) {
    return not_supported("field 'rope_scaling': " + f.get("rope_scaling")->dump() + " is not supported for step3_text");
  }
  AFD_ASSIGN_OR_RETURN(c->rope_theta, f.num_opt("rope_theta", 500000.0));
  AFD_ASSIGN_OR_RETURN(c->rms_norm_eps, f.num_opt("rms_norm_eps", 1e-5));
  // Step3TextConfig spells it singular; SGLang reads the plural: either is taken.
  AFD_ASSIGN_OR_RETURN(c->max_position_embeddings, f.int_opt("max_position_embeddings", 65536));
  AFD_ASSIGN_OR_RETURN(c->max_position_embeddings, f.int_opt("max_position_embedding", c->max_position_embeddings));
  return Status();
}

// The LLM fields of `f` (the whole config, or step3_vl's text_config); `outer` (the top level
// of a step3_vl config, else nullptr) supplies quantization_config, token ids and dtype when
// text_config lacks them.
Status parse_llm(const Fields& f, const Fields* outer, ModelConfig* c) {
  AFD_ASSIGN_OR_RETURN(c->arch, detect_arch(f, c));
  if (outer != nullptr && c->arch != Arch::step3_text) {
    return field_error("text_config.model_type", "'" + c->model_type + "' inside step3_vl (expected step3_text)");
  }
  if (is_deepseek(c->arch)) {
    AFD_RETURN_IF_ERROR(parse_deepseek(f, c));
  } else if (c->arch == Arch::step3_text) {
    AFD_RETURN_IF_ERROR(parse_step3(f, c));
  } else {
    AFD_RETURN_IF_ERROR(parse_qwen_mixtral(f, c));
  }
  auto pick = [&](const char* k) -> const Fields& { return outer != nullptr && !f.has(k) ? *outer : f; };

  AFD_ASSIGN_OR_RETURN(std::string act, f.str_opt("hidden_act", "silu"));
  if (act != "silu") return not_supported("field 'hidden_act': '" + act + "' is not supported (only silu)");
  AFD_ASSIGN_OR_RETURN(c->tie_word_embeddings, pick("tie_word_embeddings").bool_opt("tie_word_embeddings", false));
  if (c->arch == Arch::step3_text) c->tie_word_embeddings = false;  // SGLang forces untied; lm_head is stored
  AFD_ASSIGN_OR_RETURN(c->torch_dtype, pick("torch_dtype").str_opt("torch_dtype", ""));
  if (c->torch_dtype.empty()) {
    AFD_ASSIGN_OR_RETURN(c->torch_dtype, pick("dtype").str_opt("dtype", ""));
  }
  AFD_ASSIGN_OR_RETURN(c->bos_token_id, pick("bos_token_id").int_opt("bos_token_id", -1));
  AFD_ASSIGN_OR_RETURN(c->eos_token_ids, pick("eos_token_id").int_list_opt("eos_token_id"));
  if (const json* q = pick("quantization_config").get("quantization_config"))
    AFD_RETURN_IF_ERROR(parse_quantization(*q, c));
  return Status();
}

Status parse_fields(const json& root, ModelConfig* c) {
  if (!root.is_object()) return invalid_argument("not a JSON object");
  Fields top(root);
  // step3_vl (a VLM): the language model's fields are in text_config; the vision part is ignored.
  AFD_ASSIGN_OR_RETURN(std::string top_type, top.str_opt("model_type", ""));
  std::string top_arch;
  if (const json* a = top.get("architectures"); a && a->is_array() && !a->empty() && (*a)[0].is_string())
    top_arch = (*a)[0].get<std::string>();
  const bool vl = top_type == "step3_vl" || (top_type.empty() && (top_arch == "Step3VLForConditionalGeneration" ||
                                                                  top_arch == "Step3vForConditionalGeneration"));
  if (!vl) return parse_llm(top, nullptr, c);
  const json* t = top.get("text_config");
  if (t == nullptr) return field_error("text_config", "missing (step3_vl keeps the language model's fields there)");
  if (!t->is_object()) return field_error("text_config", "expected an object, got " + t->dump());
  Fields text(*t);
  if (!text.has("model_type") && !text.has("architectures")) {
    // text_config without a type: it can only be Step-3's.
    json typed = *t;
    typed["model_type"] = "step3_text";
    Fields ft(typed);
    Status s = parse_llm(ft, &top, c);
    return s.is_ok() ? s : s.with_context("text_config");
  }
  Status s = parse_llm(text, &top, c);
  return s.is_ok() ? s : s.with_context("text_config");
}

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

Result<std::string> read_file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return path_exists(path) ? io_error(path + ": cannot open for reading") : not_found(path + ": no such file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path + ": read failed");
  return ss.str();
}

}  // namespace

Status ModelConfig::validate() const {
  const bool step3 = arch == Arch::step3_text;
  const bool mla = attention == AttentionKind::mla;
  AFD_RETURN_IF_ERROR(check_range("vocab_size", vocab_size, 1, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range("hidden_size", hidden_size, 1, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range("num_hidden_layers", n_layers, 1, 4096));
  AFD_RETURN_IF_ERROR(check_range("num_attention_heads", n_heads, 1, 4096));
  const char* kv_field = step3 ? "num_attention_groups" : "num_key_value_heads";
  AFD_RETURN_IF_ERROR(check_range(kv_field, n_kv_heads, 1, n_heads));
  if (n_heads % n_kv_heads != 0) {
    return field_error(kv_field, std::to_string(n_kv_heads) + " does not divide num_attention_heads (" +
                                     std::to_string(n_heads) + ")");
  }
  if (mla) {
    AFD_RETURN_IF_ERROR(check_range("kv_lora_rank", kv_lora_rank, 1, kMaxDim));
    AFD_RETURN_IF_ERROR(check_range("qk_nope_head_dim", qk_nope_head_dim, 1, 4096));
    AFD_RETURN_IF_ERROR(check_range("qk_rope_head_dim", qk_rope_head_dim, 2, 4096));
    if (qk_rope_head_dim % 2 != 0)
      return field_error("qk_rope_head_dim", std::to_string(qk_rope_head_dim) + " must be even for RoPE");
    AFD_RETURN_IF_ERROR(check_range("v_head_dim", v_head_dim, 1, 4096));
    if (head_dim != qk_nope_head_dim + qk_rope_head_dim)
      return field_error("head_dim", "must equal qk_nope_head_dim + qk_rope_head_dim for MLA");
  } else {
    AFD_RETURN_IF_ERROR(check_range("head_dim", head_dim, 2, 4096));
    if (head_dim % 2 != 0) return field_error("head_dim", std::to_string(head_dim) + " must be even for RoPE");
    if (kv_lora_rank != 0) return field_error("kv_lora_rank", "set, but the attention is not MLA");
  }
  AFD_RETURN_IF_ERROR(check_range(step3 ? "share_q_dim" : "q_lora_rank", q_lora_rank, 0, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range(experts_field(arch), n_experts, 1, 1 << 16));
  AFD_RETURN_IF_ERROR(check_range(topk_field(arch), n_experts_per_tok, 1, n_experts));
  AFD_RETURN_IF_ERROR(check_range(arch == Arch::mixtral ? "intermediate_size" : "moe_intermediate_size",
                                  moe_intermediate_size, 1, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range(step3               ? "share_expert_dim"
                                  : is_deepseek(arch) ? "n_shared_experts"
                                                      : "shared_expert_intermediate_size",
                                  shared_expert_intermediate_size, 0, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range("decoder_sparse_step", decoder_sparse_step, 1, 4096));
  AFD_RETURN_IF_ERROR(check_range("first_k_dense_replace", first_k_dense_replace, 0, 4096));
  AFD_RETURN_IF_ERROR(check_range("moe_layer_freq", moe_layer_freq, 1, 4096));
  for (int64_t l : mlp_only_layers) AFD_RETURN_IF_ERROR(check_range("mlp_only_layers", l, 0, n_layers - 1));
  for (int64_t l : moe_layers) AFD_RETURN_IF_ERROR(check_range("moe_layers_enum", l, 0, n_layers - 1));
  AFD_RETURN_IF_ERROR(check_range("num_nextn_predict_layers", num_nextn_predict_layers, 0, 64));

  // Routing.
  AFD_RETURN_IF_ERROR(check_range("n_group", n_group, 1, n_experts));
  if (n_experts % n_group != 0) {
    return field_error("n_group", std::to_string(n_group) + " does not divide " + experts_field(arch) + " (" +
                                      std::to_string(n_experts) + ")");
  }
  AFD_RETURN_IF_ERROR(check_range("topk_group", topk_group, 1, n_group));
  if (topk_method == TopkMethod::noaux_tc && n_group > 1 && n_experts / n_group < 2) {
    return field_error("n_group", "noaux_tc scores a group by its two best experts: each of the " +
                                      std::to_string(n_group) + " groups needs at least 2");
  }
  if (topk_method != TopkMethod::greedy && n_experts_per_tok > topk_group * (n_experts / n_group)) {
    return field_error("num_experts_per_tok", std::to_string(n_experts_per_tok) + " exceeds the " +
                                                  std::to_string(topk_group * (n_experts / n_group)) +
                                                  " experts of the topk_group groups kept");
  }
  if (!std::isfinite(routed_scaling_factor) || !(routed_scaling_factor > 0))
    return field_error("routed_scaling_factor", "must be positive and finite");
  if (has_score_bias != (topk_method == TopkMethod::noaux_tc))
    return field_error("topk_method", "e_score_correction_bias exists exactly for noaux_tc");

  bool any_dense = false;
  for (int64_t l = 0; l < n_layers; ++l) any_dense |= !is_moe_layer(l);
  if (any_dense) {
    if (intermediate_size <= 0) {
      return field_error("intermediate_size",
                         "missing or not positive, but some layers are dense "
                         "(decoder_sparse_step / mlp_only_layers / first_k_dense_replace / "
                         "moe_layer_freq / moe_layers_enum)");
    }
    AFD_RETURN_IF_ERROR(check_range("intermediate_size", intermediate_size, 1, kMaxDim));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) return field_error("rope_theta", "must be positive");
  if (!(rms_norm_eps > 0) || !(rms_norm_eps < 1)) return field_error("rms_norm_eps", "must be in (0, 1)");
  AFD_RETURN_IF_ERROR(check_range(step3 ? "max_position_embedding" : "max_position_embeddings", max_position_embeddings,
                                  1, int64_t{1} << 32));
  if (rope_scaling.type == RopeScaling::Type::yarn) {
    const RopeScaling& y = rope_scaling;
    if (!mla) return field_error("rope_scaling", "yarn is only supported with MLA (deepseek)");
    if (!std::isfinite(y.factor) || !(y.factor >= 1) || y.factor > 1e6)
      return field_error("rope_scaling.factor", "must be in [1, 1e6]");
    AFD_RETURN_IF_ERROR(check_range("rope_scaling.original_max_position_embeddings", y.original_max_position_embeddings,
                                    1, int64_t{1} << 32));
    for (auto [name, v] : {std::pair<const char*, double>{"rope_scaling.beta_fast", y.beta_fast},
                           {"rope_scaling.beta_slow", y.beta_slow}}) {
      if (!std::isfinite(v) || !(v > 0)) return field_error(name, "must be positive and finite");
    }
    for (auto [name, v] : {std::pair<const char*, double>{"rope_scaling.mscale", y.mscale},
                           {"rope_scaling.mscale_all_dim", y.mscale_all_dim}}) {
      if (!std::isfinite(v) || v < 0 || v > 100) return field_error(name, "must be in [0, 100]");
    }
  }
  AFD_RETURN_IF_ERROR(check_range("sliding_window", sliding_window, 0, int64_t{1} << 32));
  for (int64_t id : eos_token_ids) AFD_RETURN_IF_ERROR(check_range("eos_token_id", id, 0, vocab_size - 1));
  if (bos_token_id != -1) AFD_RETURN_IF_ERROR(check_range("bos_token_id", bos_token_id, 0, vocab_size - 1));
  return Status();
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(source + ": not valid JSON");
  ModelConfig c;
  Status s = parse_fields(root, &c);
  if (s.is_ok()) s = c.validate();
  if (!s.is_ok()) return s.with_context(source);
  return c;
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  AFD_ASSIGN_OR_RETURN(std::string text, read_file_text(path));
  AFD_ASSIGN_OR_RETURN(ModelConfig c, parse_model_config(text, path));

  const std::string gen_path = model_dir + "/generation_config.json";
  if (path_exists(gen_path)) {
    AFD_ASSIGN_OR_RETURN(std::string gtext, read_file_text(gen_path));
    json g = json::parse(gtext, nullptr, /*allow_exceptions=*/false);
    if (g.is_discarded() || !g.is_object()) return invalid_argument(gen_path + ": not a JSON object");
    Fields f(g);
    Status s = Status();
    // generation_config.json is what generate() uses for stopping; it overrides config.json.
    auto eos = f.int_list_opt("eos_token_id");
    if (!eos.ok()) s = eos.status();
    else if (!eos->empty()) c.eos_token_ids = *eos;
    auto bos = f.int_opt("bos_token_id", c.bos_token_id);
    if (s.is_ok() && !bos.ok()) s = bos.status();
    else if (s.is_ok()) c.bos_token_id = *bos;
    if (s.is_ok()) s = c.validate();
    if (!s.is_ok()) return s.with_context(gen_path);
  }
  return c;
}

}  // namespace afd
