// config.json parsing for qwen3_moe, qwen2_moe and mixtral, following the field names and
// defaults of the Hugging Face configuration classes (Qwen3MoeConfig, Qwen2MoeConfig,
// MixtralConfig). Every error names the file and the field.
#include "model/config.h"

#include <sys/stat.h>

#include <algorithm>
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
  return Status::ok();
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
    if (!arch_from_name(c->model_type, &arch) || arch == Arch::deepseek_v2 || arch == Arch::deepseek_v3 ||
        arch == Arch::step3_text) {
      return not_supported("field 'model_type': unknown model_type '" + c->model_type +
                           "' (supported: qwen3_moe, qwen2_moe, mixtral)");
    }
    return arch;
  }
  // No model_type: fall back on architectures[0].
  if (c->architecture == "Qwen3MoeForCausalLM") arch = Arch::qwen3_moe;
  else if (c->architecture == "Qwen2MoeForCausalLM") arch = Arch::qwen2_moe;
  else if (c->architecture == "MixtralForCausalLM") arch = Arch::mixtral;
  else if (c->architecture.empty()) return field_error("model_type", "missing, and no 'architectures' to infer it from");
  else {
    return not_supported("field 'architectures': unknown architecture '" + c->architecture +
                         "' (supported: Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, MixtralForCausalLM)");
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
  return Status::ok();
}

Status parse_fields(const json& root, ModelConfig* c) {
  if (!root.is_object()) return invalid_argument("not a JSON object");
  Fields f(root);
  AFD_ASSIGN_OR_RETURN(c->arch, detect_arch(f, c));
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

  AFD_ASSIGN_OR_RETURN(std::string act, f.str_opt("hidden_act", "silu"));
  if (act != "silu") return not_supported("field 'hidden_act': '" + act + "' is not supported (only silu)");

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
  AFD_ASSIGN_OR_RETURN(c->tie_word_embeddings, f.bool_opt("tie_word_embeddings", false));
  AFD_ASSIGN_OR_RETURN(c->max_position_embeddings, f.int_opt("max_position_embeddings", mixtral ? 4096 * 32 : 32768));
  AFD_ASSIGN_OR_RETURN(c->torch_dtype, f.str_opt("torch_dtype", ""));
  if (c->torch_dtype.empty()) {
    AFD_ASSIGN_OR_RETURN(c->torch_dtype, f.str_opt("dtype", ""));
  }
  AFD_ASSIGN_OR_RETURN(c->bos_token_id, f.int_opt("bos_token_id", -1));
  AFD_ASSIGN_OR_RETURN(c->eos_token_ids, f.int_list_opt("eos_token_id"));
  if (const json* q = f.get("quantization_config")) AFD_RETURN_IF_ERROR(parse_quantization(*q, c));
  return Status::ok();
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
  AFD_RETURN_IF_ERROR(check_range("vocab_size", vocab_size, 1, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range("hidden_size", hidden_size, 1, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range("num_hidden_layers", n_layers, 1, 4096));
  AFD_RETURN_IF_ERROR(check_range("num_attention_heads", n_heads, 1, 4096));
  AFD_RETURN_IF_ERROR(check_range("num_key_value_heads", n_kv_heads, 1, n_heads));
  if (n_heads % n_kv_heads != 0) {
    return field_error("num_key_value_heads", std::to_string(n_kv_heads) + " does not divide num_attention_heads (" +
                                                  std::to_string(n_heads) + ")");
  }
  AFD_RETURN_IF_ERROR(check_range("head_dim", head_dim, 2, 4096));
  if (head_dim % 2 != 0) return field_error("head_dim", std::to_string(head_dim) + " must be even for RoPE");
  const char* experts_field = arch == Arch::mixtral ? "num_local_experts" : "num_experts";
  const char* moe_inter_field = arch == Arch::mixtral ? "intermediate_size" : "moe_intermediate_size";
  AFD_RETURN_IF_ERROR(check_range(experts_field, n_experts, 1, 1 << 16));
  AFD_RETURN_IF_ERROR(check_range("num_experts_per_tok", n_experts_per_tok, 1, n_experts));
  AFD_RETURN_IF_ERROR(check_range(moe_inter_field, moe_intermediate_size, 1, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range("shared_expert_intermediate_size", shared_expert_intermediate_size, 0, kMaxDim));
  AFD_RETURN_IF_ERROR(check_range("decoder_sparse_step", decoder_sparse_step, 1, 4096));
  for (int64_t l : mlp_only_layers) AFD_RETURN_IF_ERROR(check_range("mlp_only_layers", l, 0, n_layers - 1));
  bool any_dense = false;
  for (int64_t l = 0; l < n_layers; ++l) any_dense |= !is_moe_layer(l);
  if (any_dense) {
    if (intermediate_size <= 0) {
      return field_error("intermediate_size", "missing or not positive, but some layers are dense "
                                              "(decoder_sparse_step / mlp_only_layers)");
    }
    AFD_RETURN_IF_ERROR(check_range("intermediate_size", intermediate_size, 1, kMaxDim));
  }
  if (!(rope_theta > 0)) return field_error("rope_theta", "must be positive");
  if (!(rms_norm_eps > 0) || !(rms_norm_eps < 1)) return field_error("rms_norm_eps", "must be in (0, 1)");
  AFD_RETURN_IF_ERROR(check_range("max_position_embeddings", max_position_embeddings, 1, int64_t{1} << 32));
  AFD_RETURN_IF_ERROR(check_range("sliding_window", sliding_window, 0, int64_t{1} << 32));
  for (int64_t id : eos_token_ids) AFD_RETURN_IF_ERROR(check_range("eos_token_id", id, 0, vocab_size - 1));
  if (bos_token_id != -1) AFD_RETURN_IF_ERROR(check_range("bos_token_id", bos_token_id, 0, vocab_size - 1));
  return Status::ok();
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
    Status s = Status::ok();
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
