#include "plan/hf_model_spec.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/config.h"
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

// hidden_size, num_hidden_layers, num_attention_heads; the attention shape `s` gets the hidden
// size, head count and KV element bytes.
Status read_trunk(const Fields& f, const HfSpecOptions& o, ModelSpec* m, GqaShape* s) {
  AFD_ASSIGN_OR_RETURN(m->hidden, f.positive("hidden_size"));
  AFD_ASSIGN_OR_RETURN(m->n_layers, f.positive("num_hidden_layers"));
  s->hidden = m->hidden;
  AFD_ASSIGN_OR_RETURN(s->n_heads, f.positive("num_attention_heads"));
  s->kv_elem_bytes = o.kv_elem_bytes;
  return Status();
}

// n_moe of m's layers are MoE, the rest dense (dense_inter wide).
void add_ffn_groups(ModelSpec* m, int64_t n_moe, int64_t dense_inter, int64_t d_expert, int64_t n_routed, int64_t top_k,
                    int64_t shared_inter) {
  const int64_t n_dense = m->n_layers - n_moe;
  if (n_dense > 0) m->ffn.push_back(make_dense_ffn(n_dense, m->hidden, dense_inter));
  if (n_moe > 0) m->ffn.push_back(make_moe_ffn(n_moe, m->hidden, d_expert, n_routed, top_k, shared_inter));
}

// The families only the planner reads (the engine serves none of them): ernie4_5_moe and the
// dense qwen3, qwen2, llama, mistral, ernie4_5.
Result<ModelSpec> planner_only_spec(const Fields& f, const std::string& type, const HfSpecOptions& o) {
  ModelSpec m;
  GqaShape s;
  AFD_RETURN_IF_ERROR(read_trunk(f, o, &m, &s));
  AFD_ASSIGN_OR_RETURN(s.n_kv_heads, f.opt("num_key_value_heads", s.n_heads));
  AFD_ASSIGN_OR_RETURN(s.head_dim, f.opt("head_dim", m.hidden / s.n_heads));
  if (s.n_kv_heads < 1 || s.head_dim < 1) return invalid_argument(f.source() + ": bad num_key_value_heads/head_dim");
  m.attn.push_back(make_gqa_group("GQA", m.n_layers, s));
  AFD_ASSIGN_OR_RETURN(int64_t inter, f.opt("intermediate_size", 0));
  int64_t n_routed = 0, top_k = 0, d_expert = 0, shared_inter = 0, n_moe = 0;
  if (type == "ernie4_5_moe") {
    AFD_ASSIGN_OR_RETURN(n_routed, f.positive("moe_num_experts"));
    AFD_ASSIGN_OR_RETURN(top_k, f.positive("moe_k"));
    AFD_ASSIGN_OR_RETURN(d_expert, f.positive("moe_intermediate_size"));
    AFD_ASSIGN_OR_RETURN(int64_t n_shared, f.opt("moe_num_shared_experts", 0));
    shared_inter = n_shared * d_expert;
    AFD_ASSIGN_OR_RETURN(int64_t start, f.opt("moe_layer_start_index", 0));
    AFD_ASSIGN_OR_RETURN(int64_t interval, f.opt("moe_layer_interval", 1));
    if (interval < 1) return invalid_argument(f.source() + ": field 'moe_layer_interval' must be >= 1");
    for (int64_t l = start; l < m.n_layers; l += interval) ++n_moe;
  }
  if (n_moe < m.n_layers && inter < 1) return invalid_argument(f.source() + ": missing field 'intermediate_size'");
  add_ffn_groups(&m, n_moe, inter, d_expert, n_routed, top_k, shared_inter);
  m.id = type;
  m.display = type;
  m.weight_bytes = o.weight_bytes;
  return m;
}

// Every model_type but the planner's own is the engine's reader's to accept or refuse.
Result<ModelSpec> engine_family_spec(const std::string& json_text, const std::string& source, const HfSpecOptions& o) {
  AFD_ASSIGN_OR_RETURN(const ModelConfig c, parse_model_config(json_text, source));
  return model_spec_from_config(c, o);
}

bool planner_only_type(const std::string& t) {
  return t == "ernie4_5_moe" || t == "qwen3" || t == "qwen2" || t == "llama" || t == "mistral" || t == "ernie4_5";
}

}  // namespace

ModelSpec model_spec_from_config(const ModelConfig& c, const HfSpecOptions& o) {
  ModelSpec m;
  m.hidden = c.hidden_size;
  m.n_layers = c.n_layers;
  if (c.attention == AttentionKind::mla) {
    const MlaShape s{.hidden = c.hidden_size, .n_heads = c.n_heads, .q_lora = c.q_lora_rank, .kv_lora = c.kv_lora_rank,
                     .rope_dim = c.qk_rope_head_dim, .nope_dim = c.qk_nope_head_dim, .v_head_dim = c.v_head_dim,
                     .kv_elem_bytes = o.kv_elem_bytes};
    m.attn.push_back(make_mla_group(c.n_layers, s));
  } else {
    const GqaShape s{.hidden = c.hidden_size, .n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim,
                     .q_lora = c.q_lora_rank, .kv_elem_bytes = o.kv_elem_bytes};
    m.attn.push_back(make_gqa_group(c.q_lora_rank > 0 ? "MFA" : "GQA", c.n_layers, s));
  }
  int64_t n_moe = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) n_moe += c.is_moe_layer(l) ? 1 : 0;
  add_ffn_groups(&m, n_moe, c.intermediate_size, c.moe_intermediate_size, c.n_experts, c.n_experts_per_tok,
                 c.shared_expert_intermediate_size);
  m.id = c.model_type;
  m.display = c.model_type;
  m.weight_bytes = o.weight_bytes;
  m.vocab = c.vocab_size;
  return m;
}

Result<ModelSpec> parse_hf_model_spec(const std::string& json_text, const std::string& source, const HfSpecOptions& opt) {
  AFD_ASSIGN_OR_RETURN(const json root, parse_json(json_text, source));
  if (!root.is_object()) return corrupt_data(source + ": expected a JSON object");
  const json* cfg = &root;
  if (auto it = root.find("text_config"); it != root.end() && it->is_object()) cfg = &*it;
  std::string type;
  if (auto it = cfg->find("model_type"); it != cfg->end() && it->is_string()) type = it->get<std::string>();
  else if (auto it2 = root.find("model_type"); it2 != root.end() && it2->is_string()) type = it2->get<std::string>();
  Result<ModelSpec> m = planner_only_type(type) ? planner_only_spec(Fields(*cfg, source), type, opt)
                                                 : engine_family_spec(json_text, source, opt);
  if (m.ok()) m->notes = "from " + source;
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
