#include "serve/text/chat_template.h"

#include <fstream>
#include <sstream>

namespace afd::serve {
namespace {

using json = nlohmann::ordered_json;

// Special tokens appear as a string or as {"content": "..."} (AddedToken) in configs.
std::string token_text(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

const char* const kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                      "sep_token", "cls_token", "mask_token"};

}  // namespace

Result<ChatTemplate> ChatTemplate::from_template(const std::string& tmpl, std::string bos, std::string eos,
                                                 const jinja::Limits& limits) {
  ChatTemplate ct;
  AFD_ASSIGN_OR_RETURN(ct.tmpl_, jinja::Template::parse(tmpl, limits));
  ct.tool_source_ = tmpl;
  ct.bos_ = std::move(bos);
  ct.eos_ = std::move(eos);
  if (!ct.bos_.empty()) ct.special_tokens_["bos_token"] = ct.bos_;
  if (!ct.eos_.empty()) ct.special_tokens_["eos_token"] = ct.eos_;
  return ct;
}

Result<ChatTemplate> ChatTemplate::from_config_json(const std::string& text, const std::string& source,
                                                    const jinja::Limits& limits) {
  json cfg = json::parse(text, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) return corrupt_data(source + ": not a JSON object");
  std::string tmpl, tool_tmpl;
  if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
    tmpl = cfg["chat_template"].get<std::string>();
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
    // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    for (const json& t : cfg["chat_template"]) {
      if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) continue;
      std::string name = t.value("name", "");
      if (name == "default") tmpl = t["template"].get<std::string>();
      if (name == "tool_use") tool_tmpl = t["template"].get<std::string>();
    }
  }
  if (tmpl.empty()) return not_found(source + ": no chat_template");
  auto ct = from_template(tmpl, token_text(cfg, "bos_token"), token_text(cfg, "eos_token"), limits);
  if (!ct.ok()) return ct.status().with_context(source + ": chat_template");
  if (!tool_tmpl.empty()) {
    auto tt = jinja::Template::parse(tool_tmpl, limits);
    if (!tt.ok()) return tt.status().with_context(source + ": chat_template 'tool_use'");
    ct->tool_tmpl_ = *tt;
    ct->tool_source_ = tool_tmpl;
  }
  for (const char* k : kSpecialTokens) {
    std::string t = token_text(cfg, k);
    if (!t.empty()) ct->special_tokens_[k] = t;
  }
  return ct;
}

Result<ChatTemplate> ChatTemplate::load(const std::string& path, const jinja::Limits& limits) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_config_json(ss.str(), path, limits);
}

Result<std::string> ChatTemplate::render(const json& messages, bool add_generation_prompt, const json& tools) const {
  json ctx = json::object();
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) ctx[it.key()] = it.value();
  return (!tools.is_null() && tool_tmpl_ ? tool_tmpl_ : tmpl_)->render(ctx);
}

}  // namespace afd::serve
