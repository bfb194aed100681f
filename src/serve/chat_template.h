// ChatTemplate: the model's chat_template and special tokens from tokenizer_config.json,
// rendered with the Jinja subset (jinja.h) the way transformers' apply_chat_template does.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/jinja.h"

namespace afd::serve {

class ChatTemplate {
 public:
  // Parses tokenizer_config.json text; not_found when it has no chat_template.
  static Result<ChatTemplate> from_config_json(const std::string& text, const std::string& source);
  static Result<ChatTemplate> load(const std::string& tokenizer_config_path);
  static Result<ChatTemplate> from_template(const std::string& tmpl, std::string bos = {}, std::string eos = {});

  // messages: array of {role, content, ...}; tools: array or null.
  Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& tools = nullptr) const;
  const std::string& eos_token() const { return eos_; }
  const std::string& bos_token() const { return bos_; }

 private:
  std::shared_ptr<const jinja::Template> tmpl_;
  std::string bos_, eos_;
};

}  // namespace afd::serve
