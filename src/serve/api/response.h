// OpenAI response bodies: non-streaming completions, SSE chunks, usage, logprobs and
// error bodies. Pure functions of their inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/api/request.h"
#include "serve/api/stream_event.h"
#include "serve/api/tool_calls.h"
#include "serve/text/tokenizer.h"

namespace afd::serve {

// {"error": {"message", "type", "param": null, "code"}}
std::string error_body(int http_status, const std::string& message);
// HTTP status for a Status from parsing or scheduling.
int http_status_for(const Status& s);

struct ResponseMeta {
  std::string id;      // "cmpl-..." / "chatcmpl-..."
  std::string model;
  int64_t created = 0; // unix seconds
  Endpoint endpoint = Endpoint::completions;
  bool logprobs = false;
  std::string system_fingerprint;  // empty: the field is left out
  // Chat answers whose tool calls are parsed (OutputFormat::tool_calls): message.tool_calls,
  // delta.tool_calls, finish_reason "tool_calls".
  bool tool_calls = false;
  bool parallel_tool_calls = true;
  ToolSyntax tool_syntax = ToolSyntax::hermes;
  // The calls' id prefix: the response id without its "chatcmpl-".
  std::string call_id_prefix() const;
  // The stream state a streamed answer with tool calls needs (null when !tool_calls).
  std::unique_ptr<ToolCallStream> tool_call_stream() const;
};

// Accumulates a whole non-streaming response.
struct Completion {
  std::string text;
  std::vector<TokenInfo> tokens;
  FinishReason finish = FinishReason::none;
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

nlohmann::ordered_json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// Logprobs of `tokens` in the endpoint's format (chat: {"content": [...]}; completions:
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"}).
nlohmann::ordered_json logprobs_json(Endpoint ep, const Tokenizer& tok, const std::vector<TokenInfo>& tokens,
                                     int64_t text_offset);
std::string completion_body(const ResponseMeta& m, const Tokenizer& tok, const Completion& c);
// One SSE chunk ("data: {...}\n\n") for a step's text/tokens; finish may be none. tools: the
// answer's m.tool_call_stream() when m.tool_calls (its text then goes through it), else null;
// with it, a step whose text is all held back gives "" (no chunk).
std::string stream_chunk(const ResponseMeta& m, const Tokenizer& tok, const StreamEvent& e, bool first,
                         bool include_usage, int64_t text_offset, ToolCallStream* tools = nullptr);
// The final usage-only chunk (choices: []).
std::string stream_usage_chunk(const ResponseMeta& m, int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace afd::serve
