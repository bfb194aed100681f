#include "serve/api/request.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "serve/api/json_fields.h"

namespace afd::serve {
namespace {

using json = nlohmann::ordered_json;

constexpr auto get = json_field;
constexpr auto type_error = json_type_error;

// "'field' must be in [lo, hi], got <the value as written>".
Status range_error(const char* field, const std::string& lo, const std::string& hi, const json& got) {
  std::string m(1, '\'');
  m += field;
  m += "' must be in [" + lo + ", " + hi + "], got " + got.dump();
  return invalid_argument(std::move(m));
}

// Optional number field in [lo, hi]; leaves *out unchanged when absent or null.
Status read_number(const json& b, const char* field, double lo, double hi, float* out) {
  const json* v = get(b, field);
  if (!v) return Status();
  if (!v->is_number()) return type_error(field, "a number", *v);
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return range_error(field, std::to_string(lo), std::to_string(hi), *v);
  *out = static_cast<float>(d);
  return Status();
}

// An integer-valued JSON number (signed, unsigned, or a float without a fractional part) as an
// int64. False when it is one but outside int64 (the caller reports v.dump(), the value as
// written, never a wrapped one); *is_int says whether it is integer-valued at all.
bool as_int64(const json& v, int64_t* out, bool* is_int) {
  *is_int = true;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d)) {
      if (d < -0x1p63 || d >= 0x1p63) return false;
      *out = static_cast<int64_t>(d);
      return true;
    }
  }
  *is_int = false;
  return false;
}

Status read_int(const json& b, const char* field, int64_t lo, int64_t hi, int64_t* out, bool* present = nullptr) {
  if (present) *present = false;
  const json* v = get(b, field);
  if (!v) return Status();
  int64_t x = 0;
  bool is_int = false;
  const bool fits = as_int64(*v, &x, &is_int);
  if (!is_int) return type_error(field, "an integer", *v);
  if (!fits || x < lo || x > hi)
    return range_error(field, std::to_string(lo), std::to_string(hi), *v);
  *out = x;
  if (present) *present = true;
  return Status();
}

// `seed`: any integer in [-2^63, 2^64), kept as its 64 bits.
Status read_seed(const json& b, uint64_t* out, bool* present) {
  *present = false;
  const json* v = get(b, "seed");
  if (!v) return Status();
  if (v->is_number_unsigned()) {
    *out = v->get<uint64_t>();
  } else {
    int64_t x = 0;
    bool is_int = false;
    const bool fits = as_int64(*v, &x, &is_int);
    if (!is_int) return type_error("seed", "an integer", *v);
    if (!fits) return invalid_argument("'seed' must be in [-2^63, 2^64), got " + v->dump());
    *out = static_cast<uint64_t>(x);
  }
  *present = true;
  return Status();
}

Status read_bool(const json& b, const char* field, bool* out) {
  const json* v = get(b, field);
  if (!v) return Status();
  if (!v->is_boolean()) return type_error(field, "a boolean", *v);
  *out = v->get<bool>();
  return Status();
}

Status read_string(const json& b, const char* field, std::string* out = nullptr) {
  const json* v = get(b, field);
  if (!v) return Status();
  if (!v->is_string()) return type_error(field, "a string", *v);
  if (out) *out = v->get<std::string>();
  return Status();
}

Status read_token_ids(const json& a, const std::string& field, int64_t vocab, std::vector<int32_t>* out) {
  for (size_t i = 0; i < a.size(); ++i) {
    const json& x = a[i];
    if (!x.is_number_integer()) return type_error(field + "[" + std::to_string(i) + "]", "an integer token id", x);
    int64_t id = -1;
    bool is_int = false;
    if (!as_int64(x, &id, &is_int) || id < 0 || id >= vocab)
      return invalid_argument("'" + field + "[" + std::to_string(i) + "]' = " + x.dump() +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    out->push_back(static_cast<int32_t>(id));
  }
  return Status();
}

Status read_prompt(const json& b, const Tokenizer& tok, int64_t vocab, std::vector<int32_t>* out) {
  if (!b.contains("prompt")) return invalid_argument("'prompt' is required");
  const json& p = b["prompt"];
  if (p.is_string()) {
    AFD_ASSIGN_OR_RETURN(*out, tok.encode_prompt(p.get<std::string>()));
    return Status();
  }
  if (!p.is_array()) return type_error("prompt", "a string, an array of token ids, or a one-element array", p);
  if (p.empty()) return invalid_argument("'prompt' is empty");
  if (p[0].is_number_integer()) return read_token_ids(p, "prompt", vocab, out);
  if (p.size() != 1) return invalid_argument("'prompt' with several prompts is not supported (send one per request)");
  if (p[0].is_string()) {
    AFD_ASSIGN_OR_RETURN(*out, tok.encode_prompt(p[0].get<std::string>()));
    return Status();
  }
  if (p[0].is_array()) return read_token_ids(p[0], "prompt[0]", vocab, out);
  return type_error("prompt[0]", "a string or an array of token ids", p[0]);
}

// Checks the messages array and flattens list-of-parts content into strings.
Result<json> read_messages(const json& b) {
  if (!b.contains("messages")) return invalid_argument("'messages' is required");
  const json& m = b["messages"];
  if (!m.is_array()) return type_error("messages", "an array", m);
  if (m.empty()) return invalid_argument("'messages' is empty");
  json out = json::array();
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string f = "messages[" + std::to_string(i) + "]";
    const json& x = m[i];
    if (!x.is_object()) return type_error(f, "an object", x);
    if (!x.contains("role") || !x["role"].is_string()) return invalid_argument("'" + f + ".role' must be a string");
    std::string role = x["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      return invalid_argument("'" + f + ".role' = '" + role + "' is not one of system, user, assistant, tool, developer");
    json msg = x;
    if (role == "developer") msg["role"] = "system";
    if (!x.contains("content") || x["content"].is_null()) {
      if (role != "assistant") return invalid_argument("'" + f + ".content' is required");
      // An assistant turn of tool calls keeps its null content for the template (DeepSeek-V3's
      // renders the calls only then); encode_chat retries with "" for templates that need a string.
      msg["content"] = x.contains("tool_calls") && !x["tool_calls"].is_null() ? json(nullptr) : json("");
    } else if (x["content"].is_array()) {
      std::string text;
      for (size_t k = 0; k < x["content"].size(); ++k) {
        const json& part = x["content"][k];
        const std::string pf = f + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
          return invalid_argument("'" + pf + "' must be an object with a 'type'");
        if (part["type"] != "text") return invalid_argument("'" + pf + ".type' = " + part["type"].dump() + " is not supported (only text)");
        if (!part.contains("text") || !part["text"].is_string()) return invalid_argument("'" + pf + ".text' must be a string");
        text += part["text"].get<std::string>();
      }
      msg["content"] = text;
    } else if (!x["content"].is_string()) {
      return type_error(f + ".content", "a string or an array of text parts", x["content"]);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// A key of the request as named in a message: at most 64 bytes, cut at a UTF-8 boundary.
constexpr auto short_key = json_excerpt;

std::string quoted_key(const std::string& k) {
  std::string q(1, '\'');
  q += short_key(k);
  q += '\'';
  return q;
}

// Every top-level field afd knows, per endpoint: fields it uses, fields it accepts as metadata,
// and fields it knows in order to refuse them by name (checked in check_refused_fields).
// Anything else is refused as unknown, as OpenAI's own API does.
constexpr std::string_view kCommonFields[] = {
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
    "best_of", "logprobs", "stream", "stream_options", "ignore_eos", "frequency_penalty", "presence_penalty",
    "logit_bias", "user", "response_format", "guided_json", "guided_choice", "guided_regex", "guided_grammar"};
constexpr std::string_view kCompletionFields[] = {"prompt", "suffix", "echo"};
constexpr std::string_view kChatFields[] = {
    "messages", "add_generation_prompt", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "metadata",
    "store", "service_tier", "safety_identifier", "prompt_cache_key", "prediction",
    "functions", "function_call", "audio", "modalities", "web_search_options", "reasoning_effort", "verbosity"};

Status check_known_fields(const json& b, Endpoint ep) {
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& k = it.key();
    auto in = [&](const auto& list) { return std::find(std::begin(list), std::end(list), k) != std::end(list); };
    if (in(kCommonFields) || (ep == Endpoint::chat ? in(kChatFields) : in(kCompletionFields))) continue;
    return invalid_argument("unknown field " + quoted_key(k) + " (not supported by " +
                            (ep == Endpoint::chat ? "/v1/chat/completions" : "/v1/completions") + ")");
  }
  return Status();
}

// Chat fields that would change the output in ways afd cannot honour (400 naming the field),
// and the metadata fields it accepts without effect (type-checked only).
Status check_chat_fields(const json& b) {
  for (const char* f : {"functions", "function_call"})
    if (get(b, f))
      return invalid_argument("'" + std::string(f) + "' is not supported (deprecated by OpenAI; use 'tools' and 'tool_choice')");
  if (get(b, "audio")) return invalid_argument("'audio' is not supported (afd generates text only)");
  if (const json* v = get(b, "modalities")) {
    if (!v->is_array()) return type_error("modalities", "an array", *v);
    for (const json& x : *v)
      if (x != "text") return invalid_argument("'modalities' other than [\"text\"] is not supported (afd generates text only)");
  }
  if (get(b, "web_search_options")) return invalid_argument("'web_search_options' is not supported (afd has no web search)");
  if (get(b, "reasoning_effort"))
    return invalid_argument("'reasoning_effort' is not supported (afd cannot bound how long a model reasons)");
  if (get(b, "verbosity")) return invalid_argument("'verbosity' is not supported");
  std::string tier;
  AFD_RETURN_IF_ERROR(read_string(b, "service_tier", &tier));
  if (!tier.empty() && tier != "auto" && tier != "default")
    return invalid_argument("'service_tier' = " + quoted_key(tier) + " is not supported (afd has one tier: 'auto' or 'default')");
  for (const char* f : {"user", "safety_identifier", "prompt_cache_key"}) AFD_RETURN_IF_ERROR(read_string(b, f));
  bool store = false;
  AFD_RETURN_IF_ERROR(read_bool(b, "store", &store));
  if (const json* v = get(b, "metadata")) {
    if (!v->is_object()) return type_error("metadata", "an object", *v);
    for (auto it = v->begin(); it != v->end(); ++it)
      if (!it->is_string()) return type_error("metadata." + short_key(it.key()), "a string", *it);
  }
  if (const json* v = get(b, "prediction")) {
    if (!v->is_object()) return type_error("prediction", "an object", *v);
    const json* t = get(*v, "type");
    if (!t || *t != "content") return invalid_argument("'prediction.type' must be 'content'");
    const json* c = get(*v, "content");
    if (!c || !(c->is_string() || c->is_array()))
      return invalid_argument("'prediction.content' must be a string or an array of text parts");
  }
  return Status();
}

// U+F0000 and U+F0001 (Supplementary Private Use Area-A) bracket each message's content while
// the template renders, so the rendered text says which of its bytes came from content.
constexpr std::string_view kContentOpen = "\xF3\xB0\x80\x80", kContentClose = "\xF3\xB0\x80\x81";

// The chat prompt's token ids. plain_content: the bytes that came from message content are
// encoded with no added-token matching (control-token text stays text) and the template's
// own text with it; when the template cuts or reorders content so that its brackets do not
// pair up, content holding control-token text is refused instead.
Result<std::vector<int32_t>> encode_chat(const Tokenizer& tok, const ChatTemplate& chat, const json& messages,
                                         bool add_generation_prompt, const json& tools, bool plain_content) {
  auto render = [&](const json& m) -> Result<std::string> {
    auto text = chat.render(m, add_generation_prompt, tools);
    if (text.ok()) return text;
    // A template that cannot take a null content (Qwen3's tests `'</think>' in content`) gets
    // "" in its place, as most clients' empty tool-call turns read.
    json blank = m;
    bool had_null = false;
    for (json& x : blank)
      if (x.contains("content") && x["content"].is_null()) x["content"] = "", had_null = true;
    if (had_null) {
      auto again = chat.render(blank, add_generation_prompt, tools);
      if (again.ok()) return again;
    }
    return invalid_argument("chat template: " + text.status().message());
  };
  if (!plain_content) {
    AFD_ASSIGN_OR_RETURN(std::string text, render(messages));
    return tok.encode(text, /*parse_special=*/true);
  }
  json bracketed = messages;
  for (size_t i = 0; i < bracketed.size(); ++i) {
    json& c = bracketed[i]["content"];
    if (!c.is_string() || c.get_ref<const std::string&>().empty()) continue;
    const std::string& t = c.get_ref<const std::string&>();
    if (t.find(kContentOpen) != std::string::npos || t.find(kContentClose) != std::string::npos)
      return invalid_argument("'messages[" + std::to_string(i) +
                              "].content' holds U+F0000 or U+F0001, which --content-special-tokens text reserves");
    // Brackets around the text between leading and trailing white space, so that a template
    // that trims content (many do) still sees and removes that white space.
    const size_t b = t.find_first_not_of(" \t\r\n\f\v");
    if (b == std::string::npos) continue;
    const size_t e = t.find_last_not_of(" \t\r\n\f\v") + 1;
    c = t.substr(0, b) + std::string(kContentOpen) + t.substr(b, e - b) + std::string(kContentClose) + t.substr(e);
  }
  AFD_ASSIGN_OR_RETURN(std::string text, render(bracketed));
  // Content holding no control-token text joins the template text around it, so such
  // prompts tokenize exactly as without the option; only content that does is encoded on
  // its own, as plain text.
  std::vector<int32_t> out;
  std::string pending;  // template text and harmless content not yet encoded
  auto flush = [&]() -> Status {
    AFD_ASSIGN_OR_RETURN(std::vector<int32_t> part, tok.encode(pending, true));
    out.insert(out.end(), part.begin(), part.end());
    pending.clear();
    return Status();
  };
  size_t pos = 0;
  bool inside = false, paired = true;
  for (;;) {
    const size_t o = text.find(kContentOpen, pos), c = text.find(kContentClose, pos);
    const size_t at = std::min(o, c);
    if (at == std::string::npos) break;
    const bool is_open = at == o;
    if (is_open == inside) {  // an open inside content, or a close outside it
      paired = false;
      break;
    }
    const std::string_view seg = std::string_view(text).substr(pos, at - pos);
    if (inside) {
      AFD_ASSIGN_OR_RETURN(std::vector<int32_t> plain, tok.encode(seg, false));
      AFD_ASSIGN_OR_RETURN(std::vector<int32_t> parsed, tok.encode(seg, true));
      if (plain == parsed) {
        pending.append(seg);
      } else {
        AFD_RETURN_IF_ERROR(flush());
        out.insert(out.end(), plain.begin(), plain.end());
      }
    } else {
      pending.append(seg);
    }
    inside = is_open;
    pos = at + kContentOpen.size();
  }
  if (paired && !inside) {
    pending.append(std::string_view(text).substr(pos));
    AFD_RETURN_IF_ERROR(flush());
    return out;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& c = messages[i]["content"];
    if (!c.is_string()) continue;
    AFD_ASSIGN_OR_RETURN(std::vector<int32_t> parsed, tok.encode(c.get_ref<const std::string&>(), true));
    AFD_ASSIGN_OR_RETURN(std::vector<int32_t> plain, tok.encode(c.get_ref<const std::string&>(), false));
    if (parsed != plain)
      return invalid_argument("'messages[" + std::to_string(i) +
                              "].content' holds control-token text, refused with --content-special-tokens text (this "
                              "model's chat template rewrites message content, so it cannot be kept as plain text)");
  }
  AFD_ASSIGN_OR_RETURN(text, render(messages));
  return tok.encode(text, /*parse_special=*/true);
}

}  // namespace

Result<GenerationRequest> parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok,
                                        const ChatTemplate* chat, const RequestLimits& lim, uint64_t default_seed) {
  AFD_ASSIGN_OR_RETURN(json b, parse_json_bounded(body, lim.json));
  if (!b.is_object()) return invalid_argument("request body must be a JSON object");
  GenerationRequest r;
  r.endpoint = ep;

  if (const json* v = get(b, "model")) {
    if (!v->is_string()) return type_error("model", "a string", *v);
    std::string m = v->get<std::string>();
    if (m != lim.model_name) return not_found("The model '" + m + "' does not exist; this server serves '" + lim.model_name + "'");
  }
  AFD_RETURN_IF_ERROR(check_known_fields(b, ep));
  AFD_RETURN_IF_ERROR(read_string(b, "user"));

  if (ep == Endpoint::completions) {
    AFD_RETURN_IF_ERROR(read_prompt(b, tok, lim.vocab_size, &r.prompt));
    if (get(b, "suffix")) return invalid_argument("'suffix' is not supported");
    bool echo = false;
    AFD_RETURN_IF_ERROR(read_bool(b, "echo", &echo));
    if (echo) return invalid_argument("'echo' is not supported");
    json no_tools;
    AFD_RETURN_IF_ERROR(read_output_format(b, ep, ToolSyntax::hermes, &r.format, &no_tools));
  } else {
    if (!chat) return invalid_argument("this model has no chat template; use /v1/completions");
    AFD_RETURN_IF_ERROR(check_chat_fields(b));
    AFD_ASSIGN_OR_RETURN(json messages, read_messages(b));
    bool add_generation_prompt = true;
    AFD_RETURN_IF_ERROR(read_bool(b, "add_generation_prompt", &add_generation_prompt));
    json tools;
    AFD_RETURN_IF_ERROR(read_output_format(b, ep, tool_syntax_of_template(chat->tool_source()), &r.format, &tools));
    AFD_ASSIGN_OR_RETURN(r.prompt,
                         encode_chat(tok, *chat, messages, add_generation_prompt, tools, lim.content_special_as_text));
  }
  // Prompt tokens must also fit the model's vocabulary (the tokenizer's may be larger).
  for (int32_t id : r.prompt)
    if (id >= lim.vocab_size)
      return invalid_argument("prompt token " + std::to_string(id) + " is outside the model vocabulary of " +
                              std::to_string(lim.vocab_size));
  if (r.prompt.empty()) return invalid_argument("the prompt is empty");
  const int64_t n_prompt = static_cast<int64_t>(r.prompt.size());
  if (n_prompt >= lim.max_context)
    return invalid_argument("the prompt has " + std::to_string(n_prompt) + " tokens; this model's context is " +
                            std::to_string(lim.max_context) + " tokens");

  int64_t n = 1;
  AFD_RETURN_IF_ERROR(read_int(b, "n", 1, 1 << 20, &n));
  if (n != 1) return invalid_argument("'n' must be 1 (several choices per request are not supported)");
  int64_t best_of = 1;
  AFD_RETURN_IF_ERROR(read_int(b, "best_of", 1, 1 << 20, &best_of));
  if (best_of != 1) return invalid_argument("'best_of' must be 1");

  const int64_t room = lim.max_context - n_prompt;
  r.max_tokens = room;
  bool has_max = false;
  const int64_t kBig = int64_t{1} << 40;
  const char* max_field = get(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  AFD_RETURN_IF_ERROR(read_int(b, max_field, 1, kBig, &r.max_tokens, &has_max));
  if (has_max && r.max_tokens > room)
    return invalid_argument("'" + std::string(max_field) + "' = " + std::to_string(r.max_tokens) + " plus " +
                            std::to_string(n_prompt) + " prompt tokens exceeds the context of " +
                            std::to_string(lim.max_context) + " tokens");

  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 1.0f;
  AFD_RETURN_IF_ERROR(read_number(b, "temperature", 0.0, 2.0, &r.sampling.temperature));
  AFD_RETURN_IF_ERROR(read_number(b, "top_p", 0.0, 1.0, &r.sampling.top_p));
  if (r.sampling.top_p <= 0.0f) return invalid_argument("'top_p' must be in (0, 1]");
  int64_t top_k = 0;
  AFD_RETURN_IF_ERROR(read_int(b, "top_k", -1, 1 << 30, &top_k));
  r.sampling.top_k = top_k < 0 ? 0 : top_k;  // -1 (vLLM's "off") = 0
  uint64_t seed = 0;
  bool has_seed = false;
  AFD_RETURN_IF_ERROR(read_seed(b, &seed, &has_seed));
  r.sampling.seed = has_seed ? seed : default_seed;
  float pen = 0.0f;
  for (const char* f : {"presence_penalty", "frequency_penalty"}) {
    pen = 0.0f;
    AFD_RETURN_IF_ERROR(read_number(b, f, -2.0, 2.0, &pen));
    if (pen != 0.0f) return invalid_argument("'" + std::string(f) + "' other than 0 is not supported");
  }
  if (const json* v = get(b, "logit_bias"); v && !(v->is_object() && v->empty()))
    return invalid_argument("'logit_bias' is not supported");

  if (ep == Endpoint::chat) {
    AFD_RETURN_IF_ERROR(read_bool(b, "logprobs", &r.logprobs));
    int64_t top = 0;
    bool has_top = false;
    AFD_RETURN_IF_ERROR(read_int(b, "top_logprobs", 0, 20, &top, &has_top));
    if (has_top && top > 0 && !r.logprobs) return invalid_argument("'top_logprobs' requires 'logprobs': true");
    r.sampling.n_top_logprobs = top;
  } else {
    int64_t lp = 0;
    bool has_lp = false;
    AFD_RETURN_IF_ERROR(read_int(b, "logprobs", 0, 20, &lp, &has_lp));
    r.logprobs = has_lp;
    r.sampling.n_top_logprobs = lp;
  }
  r.sampling.logprob = r.logprobs;  // tokens are the same either way; the work is not

  if (const json* sp = get(b, "stop")) {
    const json& s = *sp;
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (size_t i = 0; i < s.size(); ++i) {
        if (!s[i].is_string()) return type_error("stop[" + std::to_string(i) + "]", "a string", s[i]);
        r.stop.push_back(s[i].get<std::string>());
      }
    } else {
      return type_error("stop", "a string or an array of strings", s);
    }
    if (static_cast<int64_t>(r.stop.size()) > lim.max_stop)
      return invalid_argument("'stop' has more than " + std::to_string(lim.max_stop) + " strings");
    for (const std::string& x : r.stop)
      if (x.empty() || static_cast<int64_t>(x.size()) > lim.max_stop_len)
        return invalid_argument("'stop' strings must be 1.." + std::to_string(lim.max_stop_len) + " bytes");
  }
  AFD_RETURN_IF_ERROR(read_bool(b, "ignore_eos", &r.ignore_eos));
  AFD_RETURN_IF_ERROR(read_bool(b, "stream", &r.stream));
  if (const json* v = get(b, "stream_options")) {
    const json& so = *v;
    if (!so.is_object()) return type_error("stream_options", "an object", so);
    if (!r.stream) return invalid_argument("'stream_options' is only allowed when 'stream' is true");
    for (auto it = so.begin(); it != so.end(); ++it)
      if (it.key() != "include_usage" && it.key() != "include_obfuscation")
        return invalid_argument("'stream_options' has an unknown field " + quoted_key(it.key()));
    AFD_RETURN_IF_ERROR(read_bool(so, "include_usage", &r.include_usage).with_context("stream_options"));
    bool obfuscate = false;
    AFD_RETURN_IF_ERROR(read_bool(so, "include_obfuscation", &obfuscate).with_context("stream_options"));
    if (obfuscate)
      return invalid_argument("'stream_options.include_obfuscation': true is not supported (afd does not pad stream events)");
  }
  AFD_RETURN_IF_ERROR(r.sampling.validate());
  return r;
}

}  // namespace afd::serve
