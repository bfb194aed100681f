// A Jinja2 subset interpreter for Hugging Face chat templates (Qwen, DeepSeek, Llama,
// Mistral styles). Supported constructs are listed in docs/SERVING.md. Rendering is
// bounded (output size and loop iterations) and never throws: template errors and
// raise_exception() come back as Status.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace afd::serve::jinja {

struct Node;

class Template {
 public:
  static Result<std::shared_ptr<const Template>> parse(const std::string& text);
  // context: a JSON object whose keys become global variables (messages,
  // add_generation_prompt, bos_token, ...).
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  ~Template();

 private:
  Template() = default;
  std::vector<std::unique_ptr<Node>> body_;
};

}  // namespace afd::serve::jinja
