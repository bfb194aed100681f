#include "serve/api/response.h"

#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

using json = nlohmann::ordered_json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json token_entry_chat(const Tokenizer& tok, int32_t id, float lp) {
  const std::string& b = tok.token_bytes(id);
  json bytes = json::array();
  for (char c : b) bytes.push_back(static_cast<int>(static_cast<uint8_t>(c)));
  return json{{"token", utf8_sanitize(b)}, {"logprob", lp}, {"bytes", bytes}};
}

const char* finish_json(FinishReason r) {
  return r == FinishReason::stop ? "stop" : r == FinishReason::length ? "length" : nullptr;
}

}  // namespace

std::string error_body(int http_status, const std::string& message) {
  // 405, 408, 411, 413, 414, 431, 501: the HTTP layer refusing how a request was sent.
  const bool framing = http_status == 405 || http_status == 408 || http_status == 411 || http_status == 413 ||
                       http_status == 414 || http_status == 431 || http_status == 501;
  const char* type = http_status == 400 || framing ? "invalid_request_error"
                     : http_status == 401 ? "authentication_error"
                     : http_status == 404 ? "not_found_error"
                     : http_status == 429 ? "rate_limit_error"
                     : http_status == 503 ? "service_unavailable"
                                          : "server_error";
  json e = {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", http_status}}}};
  return dump(e);
}

int http_status_for(const Status& s) {
  switch (s.code()) {
    case StatusCode::ok: return 200;
    case StatusCode::invalid_argument:
    case StatusCode::out_of_range: return 400;
    case StatusCode::not_found: return 404;
    case StatusCode::resource_exhausted: return 429;
    case StatusCode::unavailable:
    case StatusCode::timeout: return 503;
    default: return 500;
  }
}

json usage_json(int64_t p, int64_t c) {
  return {{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c}};
}

json logprobs_json(Endpoint ep, const Tokenizer& tok, const std::vector<TokenInfo>& tokens, int64_t text_offset) {
  if (ep == Endpoint::chat) {
    json content = json::array();
    for (const TokenInfo& t : tokens) {
      json e = token_entry_chat(tok, t.token, t.logprob);
      json top = json::array();
      for (auto& [id, lp] : t.top) top.push_back(token_entry_chat(tok, id, lp));
      e["top_logprobs"] = top;
      content.push_back(std::move(e));
    }
    return {{"content", content}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const TokenInfo& t : tokens) {
    std::string s = utf8_sanitize(tok.token_bytes(t.token));
    toks.push_back(s);
    lps.push_back(t.logprob);
    json top = json::object();
    for (auto& [id, lp] : t.top) top[utf8_sanitize(tok.token_bytes(id))] = lp;
    tops.push_back(top);
    offs.push_back(text_offset);
    text_offset += static_cast<int64_t>(s.size());
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

namespace {
// OpenAI puts system_fingerprint after "model" (key order is kept: ordered JSON).
void add_system_fingerprint(const ResponseMeta& m, json* r) {
  if (!m.system_fingerprint.empty()) (*r)["system_fingerprint"] = m.system_fingerprint;
}
}  // namespace

std::string ResponseMeta::call_id_prefix() const {
  const size_t dash = id.find('-');
  return dash == std::string::npos ? id : id.substr(dash + 1);
}

std::unique_ptr<ToolCallStream> ResponseMeta::tool_call_stream() const {
  if (!tool_calls) return nullptr;
  return std::make_unique<ToolCallStream>(tool_syntax, call_id_prefix(), parallel_tool_calls);
}

namespace {
bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }
}  // namespace

std::string completion_body(const ResponseMeta& m, const Tokenizer& tok, const Completion& c) {
  json choice;
  choice["index"] = 0;
  const char* fr = finish_json(c.finish);
  if (m.endpoint == Endpoint::chat && m.tool_calls) {
    ParsedToolCalls p = parse_tool_calls(c.text, m.tool_syntax, m.call_id_prefix(), m.parallel_tool_calls);
    json msg = {{"role", "assistant"}, {"content", p.content}};
    if (!p.calls.empty()) {
      if (blank(p.content)) msg["content"] = nullptr;
      json calls = json::array();
      for (const ToolCall& tc : p.calls)
        calls.push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
      msg["tool_calls"] = std::move(calls);
      if (c.finish == FinishReason::stop) fr = "tool_calls";
    }
    choice["message"] = std::move(msg);
  } else if (m.endpoint == Endpoint::chat) {
    choice["message"] = {{"role", "assistant"}, {"content", c.text}};
  } else {
    choice["text"] = c.text;
  }
  choice["logprobs"] = m.logprobs ? logprobs_json(m.endpoint, tok, c.tokens, 0) : json(nullptr);
  choice["finish_reason"] = fr ? json(fr) : json(nullptr);
  json r = {{"id", m.id},
            {"object", m.endpoint == Endpoint::chat ? "chat.completion" : "text_completion"},
            {"created", m.created},
            {"model", m.model},
            {"choices", json::array({choice})},
            {"usage", usage_json(c.prompt_tokens, c.completion_tokens)}};
  add_system_fingerprint(m, &r);
  return dump(r);
}

std::string stream_chunk(const ResponseMeta& m, const Tokenizer& tok, const StreamEvent& e, bool first,
                         bool include_usage, int64_t text_offset, ToolCallStream* tools) {
  json choice;
  choice["index"] = 0;
  const char* fr = finish_json(e.finish);
  if (m.endpoint == Endpoint::chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (tools) {
      ToolCallStream::Delta d = tools->add(e.text);
      if (e.finish != FinishReason::none) {
        ToolCallStream::Delta rest = tools->finish();
        d.content += rest.content;
        for (auto& x : rest.tool_calls) d.tool_calls.push_back(std::move(x));
      }
      // Text held back (a call marker may be starting) makes no chunk of its own, as OpenAI
      // sends none, unless the chunk carries the role, the end or logprobs.
      if (d.empty() && !first && e.finish == FinishReason::none && !(m.logprobs && !e.tokens.empty())) return "";
      if (!d.tool_calls.empty()) {
        delta["content"] = d.content.empty() ? json(nullptr) : json(d.content);
        delta["tool_calls"] = std::move(d.tool_calls);
      } else {
        delta["content"] = d.content;
      }
      if (e.finish == FinishReason::stop && tools->n_calls() > 0) fr = "tool_calls";
    } else {
      delta["content"] = e.text;
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = e.text;
  }
  choice["logprobs"] = m.logprobs ? logprobs_json(m.endpoint, tok, e.tokens, text_offset) : json(nullptr);
  choice["finish_reason"] = fr ? json(fr) : json(nullptr);
  json r = {{"id", m.id},
            {"object", m.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", m.created},
            {"model", m.model},
            {"choices", json::array({choice})}};
  add_system_fingerprint(m, &r);
  if (include_usage) r["usage"] = nullptr;
  return "data: " + dump(r) + "\n\n";
}

std::string stream_usage_chunk(const ResponseMeta& m, int64_t p, int64_t c) {
  json r = {{"id", m.id},
            {"object", m.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", m.created},
            {"model", m.model},
            {"choices", json::array()},
            {"usage", usage_json(p, c)}};
  add_system_fingerprint(m, &r);
  return "data: " + dump(r) + "\n\n";
}

}  // namespace afd::serve
