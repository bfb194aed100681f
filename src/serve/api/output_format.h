// What a request constrains its answer to, and how its answer is read: `response_format`
// (json_object, json_schema), vLLM's `guided_json` / `guided_choice` / `guided_regex` /
// `guided_grammar`, and `tools` with `tool_choice` / `parallel_tool_calls`. A constraint
// becomes one grammar (GBNF, serve/structured/) whose token masks the scheduler applies
// before sampling; tool calls are parsed from the answer in the chat template's syntax
// (serve/api/tool_calls.h). docs/SERVING.md "Structured outputs" lists what is supported.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/api/tool_calls.h"

namespace afd::serve {

class CompiledGrammar;

enum class Endpoint;

struct OutputFormat {
  // What constrains the answer: "" (nothing), "json_object", "json_schema", "guided_json",
  // "guided_choice", "guided_regex", "guided_grammar", "tool_calls" (tool_choice "required"
  // or a named function).
  std::string kind;
  std::string gbnf;  // the answer's grammar; empty: unconstrained
  // gbnf compiled against the served tokenizer (ModelServing::grammars), set by the API
  // before the request is run; null when gbnf is empty.
  std::shared_ptr<const CompiledGrammar> grammar;
  bool tool_calls = false;  // the answer's tool calls are parsed (tools, tool_choice not "none")
  bool parallel_tool_calls = true;
  ToolSyntax tool_syntax = ToolSyntax::hermes;
};

// Reads the fields above from a request body (chat and completions; tools only on chat).
// syntax: the chat template's tool-call syntax. *tools_out: the tools for the template to
// render (null when none are given or tool_choice is "none"). Errors: invalid_argument
// naming the field (an unsupported schema keyword, a regex the subset cannot express, a
// grammar that does not parse, duplicate tool names, tool_choice naming a missing tool,
// two constraints in one request).
Status read_output_format(const nlohmann::ordered_json& body, Endpoint ep, ToolSyntax syntax, OutputFormat* out,
                          nlohmann::ordered_json* tools_out);

}  // namespace afd::serve
