#include "plan/hf_model_spec.h"

#include <filesystem>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "plan/model_builders.h"
#include "plan/text_file.h"

namespace afd::plan {
namespace {

using nlohmann::json;

// Reads integer fields with errors that name the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string source) : j_(j), source_(std::move(source)) {}
  Result<int64_t> req(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return invalid_argument(source_ + ": missing field '" + key + "'");
    return num(*it, key);
  }
  Result<int64_t> opt(const char* key, int64_t dflt) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return dflt;
    return num(*it, key);
  }
  Result<int64_t> positive(const char* key) const {
    AFD_ASSIGN_OR_RETURN(int64_t v, req(key));
    if (v < 1) return invalid_argument(source_ + ": field '" + key + "' must be >= 1");
    return v;
  }
  const json& raw() const { return j_; }
  const std::string& source() const { return source_; }

 private:
  Result<int64_t> num(const json& v, const char* key) const {
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>()))))
      return invalid_argument(source_ + ": field '" + key + "' must be an integer");
    const int64_t x = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
    if (x < 0 || x > (int64_t{1} << 40)) return invalid_argument(source_ + ": field '" + key + "' out of range");
    return x;
  }
  const json& j_;
  std::string source_;
};

// The fields every family names alike: hidden_size, num_hidden_layers, num_attention_heads; the
// attention shape `s` gets the hidden size, head count and KV element bytes.
template <class Shape>
Status read_trunk(const Fields& f, const HfSpecOptions& o, ModelSpec* m, Shape* s) {
  AFD_ASSIGN_OR_RETURN(m->hidden, f.positive("hidden_size"));
  AFD_ASSIGN_OR_RETURN(m->n_layers, f.positive("num_hidden_layers"));
  s->hidden = m->hidden;
  AFD_ASSIGN_OR_RETURN(s->n_heads, f.positive("num_attention_heads"));
  s->kv_elem_bytes = o.kv_elem_bytes;
  return Status::ok();
}

// n_moe of m's layers are MoE, the rest dense (dense_inter wide).
void add_ffn_groups(ModelSpec* m, int64_t n_moe, int64_t dense_inter, int64_t d_expert, int64_t n_routed, int64_t top_k,
                    int64_t shared_inter) {
  const int64_t n_dense = m->n_layers - n_moe;
  if (n_dense > 0) m->ffn.push_back(make_dense_ffn(n_dense, m->hidden, dense_inter));
  if (n_moe > 0) m->ffn.push_back(make_moe_ffn(n_moe, m->hidden, d_expert, n_routed, top_k, shared_inter));
}

Result<ModelSpec> mla_spec(const Fields& f, const HfSpecOptions& o) {
  ModelSpec m;
  MlaShape s;
  AFD_RETURN_IF_ERROR(read_trunk(f, o, &m, &s));
  AFD_ASSIGN_OR_RETURN(s.q_lora, f.opt("q_lora_rank", 0));
  AFD_ASSIGN_OR_RETURN(s.kv_lora, f.positive("kv_lora_rank"));
  AFD_ASSIGN_OR_RETURN(s.rope_dim, f.positive("qk_rope_head_dim"));
  AFD_ASSIGN_OR_RETURN(s.nope_dim, f.positive("qk_nope_head_dim"));
  AFD_ASSIGN_OR_RETURN(s.v_head_dim, f.positive("v_head_dim"));
  m.attn.push_back(make_mla_group(m.n_layers, s));
  AFD_ASSIGN_OR_RETURN(int64_t n_routed, f.opt("n_routed_experts", 0));
  AFD_ASSIGN_OR_RETURN(int64_t top_k, f.opt("num_experts_per_tok", 0));
  AFD_ASSIGN_OR_RETURN(int64_t n_shared, f.opt("n_shared_experts", 0));
  AFD_ASSIGN_OR_RETURN(int64_t d_expert, f.opt("moe_intermediate_size", 0));
  AFD_ASSIGN_OR_RETURN(int64_t dense_inter, f.positive("intermediate_size"));
  AFD_ASSIGN_OR_RETURN(int64_t first_dense, f.opt("first_k_dense_replace", 0));
  AFD_ASSIGN_OR_RETURN(int64_t freq, f.opt("moe_layer_freq", 1));
  if (freq < 1) return invalid_argument(f.source() + ": field 'moe_layer_freq' must be >= 1");
  int64_t n_moe = 0;
  if (n_routed > 0)
    for (int64_t l = first_dense; l < m.n_layers; ++l)
      if (l % freq == 0) ++n_moe;
  add_ffn_groups(&m, n_moe, dense_inter, d_expert, n_routed, top_k, n_shared * d_expert);
  return m;
}

Result<ModelSpec> gqa_spec(const Fields& f, const std::string& type, const HfSpecOptions& o) {
  ModelSpec m;
  GqaShape s;
  AFD_RETURN_IF_ERROR(read_trunk(f, o, &m, &s));
  AFD_ASSIGN_OR_RETURN(s.n_kv_heads, f.opt("num_key_value_heads", s.n_heads));
  AFD_ASSIGN_OR_RETURN(s.head_dim, f.opt("head_dim", m.hidden / s.n_heads));
  if (s.n_kv_heads < 1 || s.head_dim < 1) return invalid_argument(f.source() + ": bad num_key_value_heads/head_dim");
  m.attn.push_back(make_gqa_group("GQA", m.n_layers, s));
  AFD_ASSIGN_OR_RETURN(int64_t inter, f.opt("intermediate_size", 0));
  int64_t n_routed = 0, top_k = 0, d_expert = 0, shared_inter = 0;
  std::vector<bool> is_moe(m.n_layers, false);
  if (type == "mixtral") {
    AFD_ASSIGN_OR_RETURN(n_routed, f.positive("num_local_experts"));
    AFD_ASSIGN_OR_RETURN(top_k, f.positive("num_experts_per_tok"));
    d_expert = inter;
    is_moe.assign(m.n_layers, true);
  } else if (type == "qwen3_moe" || type == "qwen2_moe") {
    AFD_ASSIGN_OR_RETURN(n_routed, f.positive("num_experts"));
    AFD_ASSIGN_OR_RETURN(top_k, f.positive("num_experts_per_tok"));
    AFD_ASSIGN_OR_RETURN(d_expert, f.positive("moe_intermediate_size"));
    AFD_ASSIGN_OR_RETURN(shared_inter, f.opt("shared_expert_intermediate_size", 0));
    AFD_ASSIGN_OR_RETURN(int64_t step, f.opt("decoder_sparse_step", 1));
    if (step < 1) return invalid_argument(f.source() + ": field 'decoder_sparse_step' must be >= 1");
    std::set<int64_t> mlp_only;
    if (auto it = f.raw().find("mlp_only_layers"); it != f.raw().end() && !it->is_null()) {
      if (!it->is_array()) return invalid_argument(f.source() + ": field 'mlp_only_layers' must be an array");
      for (const auto& v : *it) {
        if (!v.is_number_integer()) return invalid_argument(f.source() + ": 'mlp_only_layers' entries must be integers");
        mlp_only.insert(v.get<int64_t>());
      }
    }
    for (int64_t l = 0; l < m.n_layers; ++l) is_moe[l] = !mlp_only.count(l) && (l + 1) % step == 0;
  } else if (type == "ernie4_5_moe") {
    AFD_ASSIGN_OR_RETURN(n_routed, f.positive("moe_num_experts"));
    AFD_ASSIGN_OR_RETURN(top_k, f.positive("moe_k"));
    AFD_ASSIGN_OR_RETURN(d_expert, f.positive("moe_intermediate_size"));
    AFD_ASSIGN_OR_RETURN(int64_t n_shared, f.opt("moe_num_shared_experts", 0));
    shared_inter = n_shared * d_expert;
    AFD_ASSIGN_OR_RETURN(int64_t start, f.opt("moe_layer_start_index", 0));
    AFD_ASSIGN_OR_RETURN(int64_t interval, f.opt("moe_layer_interval", 1));
    if (interval < 1) return invalid_argument(f.source() + ": field 'moe_layer_interval' must be >= 1");
    for (int64_t l = start; l < m.n_layers; l += interval) is_moe[l] = true;
  }
  int64_t n_moe = 0;
  for (bool b : is_moe) n_moe += b ? 1 : 0;
  if (n_moe < m.n_layers && inter < 1) return invalid_argument(f.source() + ": missing field 'intermediate_size'");
  add_ffn_groups(&m, n_moe, inter, d_expert, n_routed, top_k, shared_inter);
  return m;
}

Result<ModelSpec> step3_spec(const Fields& f, const HfSpecOptions& o) {
  ModelSpec m;
  GqaShape s;
  AFD_RETURN_IF_ERROR(read_trunk(f, o, &m, &s));
  AFD_ASSIGN_OR_RETURN(s.n_kv_heads, f.opt("num_attention_groups", 1));
  AFD_ASSIGN_OR_RETURN(s.head_dim, f.positive("head_dim"));
  AFD_ASSIGN_OR_RETURN(s.q_lora, f.positive("share_q_dim"));
  m.attn.push_back(make_gqa_group("MFA", m.n_layers, s));
  AFD_ASSIGN_OR_RETURN(int64_t inter, f.positive("intermediate_size"));
  AFD_ASSIGN_OR_RETURN(int64_t n_routed, f.positive("moe_num_experts"));
  AFD_ASSIGN_OR_RETURN(int64_t top_k, f.positive("moe_top_k"));
  AFD_ASSIGN_OR_RETURN(int64_t d_expert, f.positive("moe_intermediate_size"));
  AFD_ASSIGN_OR_RETURN(int64_t shared, f.opt("share_expert_dim", 0));
  int64_t n_moe = 0;
  auto it = f.raw().find("moe_layers_enum");
  if (it != f.raw().end() && it->is_string()) {
    std::stringstream ss(it->get<std::string>());
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      if (tok.find_first_not_of(" 0123456789") != std::string::npos || tok.find_first_of("0123456789") == std::string::npos)
        return invalid_argument(f.source() + ": field 'moe_layers_enum' must list layer numbers");
      const int64_t l = std::stoll(tok);
      if (l < 0 || l >= m.n_layers) return invalid_argument(f.source() + ": 'moe_layers_enum' layer out of range");
      ++n_moe;
    }
  } else {
    n_moe = m.n_layers;
  }
  add_ffn_groups(&m, n_moe, inter, d_expert, n_routed, top_k, shared);
  return m;
}

}  // namespace

Result<ModelSpec> parse_hf_model_spec(const std::string& json_text, const std::string& source, const HfSpecOptions& opt) {
  AFD_ASSIGN_OR_RETURN(const json root, parse_json(json_text, source));
  if (!root.is_object()) return corrupt_data(source + ": expected a JSON object");
  const json* cfg = &root;
  if (auto it = root.find("text_config"); it != root.end() && it->is_object()) cfg = &*it;
  std::string type;
  if (auto it = cfg->find("model_type"); it != cfg->end() && it->is_string()) type = it->get<std::string>();
  else if (auto it2 = root.find("model_type"); it2 != root.end() && it2->is_string()) type = it2->get<std::string>();
  if (type.empty()) return invalid_argument(source + ": missing field 'model_type'");
  Fields f(*cfg, source);
  Result<ModelSpec> m = not_supported(source + ": model_type '" + type + "' is not supported by the cost model");
  if (type == "deepseek_v3" || type == "deepseek_v2" || type == "kimi_k2") {
    m = mla_spec(f, opt);
  } else if (type == "qwen3_moe" || type == "qwen2_moe" || type == "mixtral" || type == "ernie4_5_moe" ||
             type == "qwen3" || type == "qwen2" || type == "llama" || type == "mistral" || type == "ernie4_5") {
    m = gqa_spec(f, type, opt);
  } else if (type == "step3_text" || type == "step3v" || type == "step3") {
    m = step3_spec(f, opt);
  }
  if (!m.ok()) return m;
  m->id = type;
  m->display = type;
  m->weight_bytes = opt.weight_bytes;
  m->notes = "from " + source;
  return m;
}

Result<ModelSpec> load_hf_model_spec(const std::string& path, const HfSpecOptions& opt) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  AFD_ASSIGN_OR_RETURN(const std::string text, read_text_file(p.string(), "model config"));
  return parse_hf_model_spec(text, p.string(), opt);
}

}  // namespace afd::plan
