// ChatTemplate: the model's chat_template and special tokens from tokenizer_config.json,
// rendered with the Jinja subset (jinja.h) the way transformers' apply_chat_template does.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/text/jinja.h"

namespace afd::serve {

class ChatTemplate {
 public:
  // Parses tokenizer_config.json text; not_found when it has no chat_template. A template
  // the Jinja subset refuses (syntax, or nesting beyond jinja::Limits) is an error naming
  // `source` and the limit. Of a list of named templates, "default" is used, and
  // "tool_use" when the request has tools (as transformers picks them).
  static Result<ChatTemplate> from_config_json(const std::string& text, const std::string& source,
                                               const jinja::Limits& limits = {});
  static Result<ChatTemplate> load(const std::string& tokenizer_config_path, const jinja::Limits& limits = {});
  // Empty bos/eos: the token is not defined (as a null special token in transformers).
  static Result<ChatTemplate> from_template(const std::string& tmpl, std::string bos = {}, std::string eos = {},
                                            const jinja::Limits& limits = {});

  // messages: array of {role, content, ...}; tools: array or null. The template sees, as
  // in transformers: messages, tools (none when absent), documents (none),
  // add_generation_prompt, and each special token the config defines (bos_token,
  // eos_token, unk_token, pad_token, sep_token, cls_token, mask_token).
  Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& tools = nullptr) const;
  const std::string& eos_token() const { return eos_; }
  const std::string& bos_token() const { return bos_; }
  // The source text of the template that renders requests with tools (it says how the model
  // writes tool calls: serve/api/tool_calls.h).
  const std::string& tool_source() const { return tool_source_; }

 private:
  std::shared_ptr<const jinja::Template> tmpl_;
  std::shared_ptr<const jinja::Template> tool_tmpl_;  // null: tmpl_ serves requests with tools too
  std::string tool_source_;
  std::string bos_, eos_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();  // name -> text
};

}  // namespace afd::serve
