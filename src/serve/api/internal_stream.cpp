#include "serve/api/internal_stream.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "serve/api/response.h"

namespace afd::serve {
namespace {

using json = nlohmann::ordered_json;

// Deepest nesting of arrays and objects in a JSON text (strings skipped), counted before
// parsing so that a hostile text cannot make the parser or a value's destructor recurse deeply.
int nesting_depth(std::string_view s) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return deepest;
}

Result<json> parse_bounded(std::string_view text, int max_depth, const char* what) {
  if (nesting_depth(text) > max_depth)
    return invalid_argument(std::string(what) + ": nested deeper than " + std::to_string(max_depth) + " levels");
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(std::string(what) + ": not valid JSON");
  if (!j.is_object()) return invalid_argument(std::string(what) + ": not a JSON object");
  return j;
}

Result<std::vector<int32_t>> token_ids(const json& j, const std::string& what) {
  if (!j.is_array()) return invalid_argument(what + ": not an array of token ids");
  std::vector<int32_t> out;
  out.reserve(j.size());
  for (const json& t : j) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return invalid_argument(what + ": element " + std::to_string(out.size()) + " is not a token id");
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return out;
}

Result<uint64_t> unsigned_field(const json& j, const char* key, const std::string& what) {
  const auto it = j.find(key);
  if (it == j.end()) return invalid_argument(what + ": '" + key + "' is missing");
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
    return invalid_argument(what + ": '" + key + "' is not a non-negative integer");
  return it->get<uint64_t>();
}

// A logprob as JSON: a number, or null for -inf / NaN (which JSON cannot hold; the OpenAI
// body renders them as null too, so the round trip keeps the client's bytes).
float logprob_of(const json& j) {
  return j.is_number() ? j.get<float>() : -std::numeric_limits<float>::infinity();
}

StatusCode code_for_http(int status) {
  switch (status) {
    case 400: return StatusCode::invalid_argument;
    case 404: return StatusCode::not_found;
    case 429: return StatusCode::resource_exhausted;
    case 503: return StatusCode::unavailable;
    default: return StatusCode::internal;
  }
}

}  // namespace

std::string encode_control(const InternalControl& c) {
  json j = {{"prompt", c.prompt},
            {"max_tokens", c.max_tokens},
            {"seed", c.seed},
            {"generated", c.generated},
            {"rng", c.rng_draws},
            {"replay", c.replay_exact ? "exact" : "prefill"},
            {"keepalive_ms", c.keepalive_ms}};
  return j.dump();
}

Result<InternalBody> split_internal_body(std::string_view raw) {
  const size_t nl = raw.find('\n');
  if (nl == std::string_view::npos)
    return invalid_argument("internal stream request: no control line (expected '<control JSON>\\n<body>')");
  AFD_ASSIGN_OR_RETURN(json j, parse_bounded(raw.substr(0, nl), 2, "internal stream control line"));
  const std::string what = "internal stream control line";
  for (const auto& [k, v] : j.items()) {
    if (k != "prompt" && k != "max_tokens" && k != "seed" && k != "generated" && k != "rng" && k != "replay" &&
        k != "keepalive_ms")
      return invalid_argument(what + ": unknown field '" + k + "'");
  }
  InternalBody out;
  InternalControl& c = out.control;
  if (!j.contains("prompt")) return invalid_argument(what + ": 'prompt' is missing");
  AFD_ASSIGN_OR_RETURN(c.prompt, token_ids(j["prompt"], what + ": prompt"));
  if (j.contains("generated")) {
    AFD_ASSIGN_OR_RETURN(c.generated, token_ids(j["generated"], what + ": generated"));
  }
  AFD_ASSIGN_OR_RETURN(uint64_t max_tokens, unsigned_field(j, "max_tokens", what));
  if (max_tokens > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return invalid_argument(what + ": 'max_tokens' is out of range");
  c.max_tokens = static_cast<int64_t>(max_tokens);
  AFD_ASSIGN_OR_RETURN(c.seed, unsigned_field(j, "seed", what));
  c.rng_draws = 0;
  if (j.contains("rng")) {
    AFD_ASSIGN_OR_RETURN(c.rng_draws, unsigned_field(j, "rng", what));
  }
  if (j.contains("replay")) {
    if (j["replay"] != "exact" && j["replay"] != "prefill")
      return invalid_argument(what + ": 'replay' must be \"exact\" or \"prefill\"");
    c.replay_exact = j["replay"] == "exact";
  }
  AFD_ASSIGN_OR_RETURN(uint64_t keepalive, unsigned_field(j, "keepalive_ms", what));
  if (keepalive < 10 || keepalive > 600000)
    return invalid_argument(what + ": 'keepalive_ms' must be in [10, 600000], got " + std::to_string(keepalive));
  c.keepalive_ms = static_cast<int64_t>(keepalive);
  out.body = std::string(raw.substr(nl + 1));
  return out;
}

std::string encode_event(const StreamEvent& e) {
  json j = json::object();
  if (e.finish == FinishReason::error || e.finish == FinishReason::cancelled) {
    // cancelled: the worker's scheduler stopped with the request unfinished.
    int st = e.finish == FinishReason::cancelled ? 503 : http_status_for(e.error);
    if (st == 200) st = 500;
    j["error"] = {{"code", st},
                  {"message", e.error.message().empty() ? std::string(finish_reason_name(e.finish)) : e.error.message()},
                  {"resumable", e.finish == FinishReason::cancelled}};
  } else {
    j["text"] = e.text;
    json toks = json::array();
    for (const TokenInfo& t : e.tokens) {
      json one = {t.token, t.logprob};
      if (!t.top.empty()) {
        json top = json::array();
        for (const auto& [id, lp] : t.top) top.push_back({id, lp});
        one.push_back(std::move(top));
      }
      toks.push_back(std::move(one));
    }
    j["tokens"] = std::move(toks);
    j["rng"] = e.rng_draws;
    if (e.finish != FinishReason::none) {
      j["finish"] = finish_reason_name(e.finish);
      j["usage"] = {e.prompt_tokens, e.completion_tokens};
    }
  }
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

Result<InternalEvent> decode_event(std::string_view data) {
  const std::string what = "internal stream event";
  AFD_ASSIGN_OR_RETURN(json j, parse_bounded(data, 5, "internal stream event"));
  InternalEvent out;
  StreamEvent& e = out.event;
  if (j.contains("error")) {
    const json& err = j["error"];
    if (!err.is_object() || !err.contains("code") || !err["code"].is_number_integer() || !err.contains("message") ||
        !err["message"].is_string() || !err.contains("resumable") || !err["resumable"].is_boolean())
      return invalid_argument(what + ": 'error' needs code (integer), message (string), resumable (boolean)");
    const int64_t code = err["code"].get<int64_t>();
    if (code < 400 || code > 599) return invalid_argument(what + ": error code " + std::to_string(code) + " is not an HTTP error");
    out.http_status = static_cast<int>(code);
    out.resumable = err["resumable"].get<bool>();
    e.finish = out.resumable ? FinishReason::cancelled : FinishReason::error;
    e.error = Status(code_for_http(out.http_status), err["message"].get<std::string>());
    return out;
  }
  if (!j.contains("text") || !j["text"].is_string()) return invalid_argument(what + ": 'text' is missing or not a string");
  e.text = j["text"].get<std::string>();
  if (!j.contains("tokens") || !j["tokens"].is_array()) return invalid_argument(what + ": 'tokens' is missing or not an array");
  for (const json& t : j["tokens"]) {
    if (!t.is_array() || t.size() < 2 || t.size() > 3 || !t[0].is_number_integer() || t[0].get<int64_t>() < 0 ||
        t[0].get<int64_t>() > std::numeric_limits<int32_t>::max() || !(t[1].is_number() || t[1].is_null()))
      return invalid_argument(what + ": a token is not [id, logprob(, top)]");
    TokenInfo ti;
    ti.token = static_cast<int32_t>(t[0].get<int64_t>());
    ti.logprob = logprob_of(t[1]);
    if (t.size() == 3) {
      if (!t[2].is_array()) return invalid_argument(what + ": a token's top logprobs are not an array");
      for (const json& p : t[2]) {
        if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || p[0].get<int64_t>() < 0 ||
            p[0].get<int64_t>() > std::numeric_limits<int32_t>::max() || !(p[1].is_number() || p[1].is_null()))
          return invalid_argument(what + ": a top logprob is not [id, logprob]");
        ti.top.emplace_back(static_cast<int32_t>(p[0].get<int64_t>()), logprob_of(p[1]));
      }
    }
    e.tokens.push_back(std::move(ti));
  }
  AFD_ASSIGN_OR_RETURN(e.rng_draws, unsigned_field(j, "rng", what));
  if (j.contains("finish")) {
    const json& f = j["finish"];
    if (f == "stop") e.finish = FinishReason::stop;
    else if (f == "length") e.finish = FinishReason::length;
    else return invalid_argument(what + ": 'finish' is not \"stop\" or \"length\"");
    const auto u = j.find("usage");
    if (u == j.end() || !u->is_array() || u->size() != 2 || !(*u)[0].is_number_integer() ||
        !(*u)[1].is_number_integer() || (*u)[0].get<int64_t>() < 0 || (*u)[1].get<int64_t>() < 0)
      return invalid_argument(what + ": the last event's 'usage' is not [prompt_tokens, completion_tokens]");
    e.prompt_tokens = (*u)[0].get<int64_t>();
    e.completion_tokens = (*u)[1].get<int64_t>();
  }
  return out;
}

}  // namespace afd::serve
