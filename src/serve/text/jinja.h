// A Jinja2 subset interpreter for Hugging Face chat templates (Qwen, DeepSeek, Llama,
// Mistral, Gemma styles), rendering as transformers' apply_chat_template does with
// Python's jinja2. Supported constructs are listed in docs/TOKENIZER.md.
//
// Everything is bounded by Limits: parsing refuses templates nested deeper than the
// limits (so neither the parser nor the evaluator recurses without bound), and rendering
// stops with an error Status naming the limit when a template or its data would exceed
// the evaluation depth, data depth, output size, allocation or step budget. Nothing
// throws: template errors and raise_exception() come back as Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace afd::serve::jinja {

struct Node;

// Defaults are far above what real chat templates need (the largest are ~20 KB with
// nesting under 20) and keep one render within a few hundred MiB and ~a second of CPU.
struct Limits {
  // Parse time.
  int max_expr_depth = 128;   // height of one expression's tree (parentheses, operators, filters)
  int max_block_depth = 64;   // nested {% if/for/macro/set/generation %} blocks
  // Render time.
  int max_eval_depth = 1024;  // nested statements + expressions + macro calls being evaluated
  int max_call_depth = 64;    // nested macro calls
  int max_data_depth = 256;   // nesting of any value, including the context (messages, tools)
  size_t max_output_bytes = size_t{16} << 20;  // the rendered text, and any one string value
  size_t max_alloc_bytes = size_t{256} << 20;  // bytes of strings and values built, cumulative
  int64_t max_steps = 10'000'000;  // statements, expressions, loop iterations, items in builtins
  int64_t max_range = 100'000;     // items of one range() (the limit of jinja2's sandbox)
};

class Template {
 public:
  static Result<std::shared_ptr<const Template>> parse(const std::string& text, const Limits& limits = {});
  // context: a JSON object whose keys become global variables (messages,
  // add_generation_prompt, bos_token, ...). It is read, never copied.
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  const Limits& limits() const { return limits_; }
  ~Template();

 private:
  Template() = default;
  std::vector<std::unique_ptr<Node>> body_;
  Limits limits_;
};

}  // namespace afd::serve::jinja
