// Tool calls in a model's output, in the syntax of its family's chat template: finding them
// (parse_tool_calls for a whole answer, ToolCallStream for a streamed one, as OpenAI's
// message.tool_calls / delta.tool_calls) and the grammar that forces them (tool_call_gbnf,
// for tool_choice "required" or a named function).
//
// Syntaxes (docs/SERVING.md "Tool calls"):
//   hermes       <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>, one block per
//                call, separated by "\n" (Qwen3's template, the default model's, and the form
//                used for templates afd does not recognise);
//   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
//                <｜tool▁call▁end｜> [\n<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>]* <｜tool▁calls▁end｜>.
// ARGS is a JSON object. The answer's content is the text before the first call; text after
// the calls is dropped, as vLLM's parsers do.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace afd::serve {

enum class ToolSyntax { hermes, deepseek_v3 };
const char* tool_syntax_name(ToolSyntax s);

// The syntax a chat template's source text writes tool calls in: deepseek_v3 when it uses
// DeepSeek's tool-call markers, else hermes.
ToolSyntax tool_syntax_of_template(std::string_view template_source);

struct ToolCall {
  std::string id;         // "call_<id_prefix>_<index>"
  std::string name;
  std::string arguments;  // the JSON text the model wrote
};

struct ParsedToolCalls {
  std::string content;    // the text before the first call (the whole text when no call parses)
  std::vector<ToolCall> calls;
};

// The calls in a finished answer (parallel false: the first only). A call block that does
// not parse (bad JSON, a missing name, arguments that are not an object, a block left open)
// makes the whole text content with no calls, so nothing the model wrote is lost.
ParsedToolCalls parse_tool_calls(std::string_view text, ToolSyntax syntax, std::string_view id_prefix,
                                 bool parallel = true);

// A streamed answer's text → OpenAI chat deltas. Content is released as it arrives except a
// tail that could begin a call marker; each call is released as {index, id, type, function:
// {name, arguments: ""}} once its name is known, then {index, function: {arguments: piece}}
// as its arguments arrive. A call left unfinished at the end is released as content.
class ToolCallStream {
 public:
  // parallel false: calls after the first are not released.
  ToolCallStream(ToolSyntax syntax, std::string id_prefix, bool parallel = true);
  struct Delta {
    std::string content;
    nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();  // OpenAI delta.tool_calls items
    bool empty() const { return content.empty() && tool_calls.empty(); }
  };
  // The deltas that text (the next piece of the answer) releases.
  Delta add(std::string_view text);
  // At the end of the answer: whatever was held back.
  Delta finish();
  // Calls released so far (finish_reason "tool_calls" when > 0 at the end).
  int64_t n_calls() const { return static_cast<int64_t>(sent_args_.size()); }

 private:
  Delta release(bool final);

  ToolSyntax syntax_;
  std::string id_prefix_;
  bool parallel_;
  std::string text_;               // the whole answer so far
  size_t sent_content_ = 0;        // bytes of content released
  std::vector<size_t> sent_args_;  // per released call: argument bytes released
  bool finished_ = false;
};

// The grammar (GBNF, serve/structured/) of an answer that is only tool calls: one call, or
// with `parallel` one or more, of the function named `only` (empty: any of `tools`), whose
// arguments validate against that function's `parameters` (a JSON Schema; absent: any
// object). tools: the request's validated `tools` array. Errors: a schema the compiler
// refuses (invalid_argument naming the tool).
Result<std::string> tool_call_gbnf(ToolSyntax syntax, const nlohmann::ordered_json& tools, std::string_view only, bool parallel);

}  // namespace afd::serve
