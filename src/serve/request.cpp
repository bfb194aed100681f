#include "serve/request.h"

#include <cmath>

namespace afd::serve {
namespace {

using json = nlohmann::ordered_json;

Status type_error(const std::string& field, const char* want, const json& got) {
  return invalid_argument("'" + field + "' must be " + want + ", got " + std::string(got.type_name()));
}

// Optional number field in [lo, hi]; leaves *out unchanged when absent or null.
Status read_number(const json& b, const char* field, double lo, double hi, float* out) {
  if (!b.contains(field) || b[field].is_null()) return Status::ok();
  const json& v = b[field];
  if (!v.is_number()) return type_error(field, "a number", v);
  double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return invalid_argument("'" + std::string(field) + "' must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got " + v.dump());
  *out = static_cast<float>(d);
  return Status::ok();
}

Status read_int(const json& b, const char* field, int64_t lo, int64_t hi, int64_t* out, bool* present = nullptr) {
  if (present) *present = false;
  if (!b.contains(field) || b[field].is_null()) return Status::ok();
  const json& v = b[field];
  int64_t x;
  if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
             std::fabs(v.get<double>()) < 9e18) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    return type_error(field, "an integer", v);
  }
  if (x < lo || x > hi)
    return invalid_argument("'" + std::string(field) + "' must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got " + std::to_string(x));
  *out = x;
  if (present) *present = true;
  return Status::ok();
}

Status read_bool(const json& b, const char* field, bool* out) {
  if (!b.contains(field) || b[field].is_null()) return Status::ok();
  if (!b[field].is_boolean()) return type_error(field, "a boolean", b[field]);
  *out = b[field].get<bool>();
  return Status::ok();
}

Status read_token_ids(const json& a, const std::string& field, int64_t vocab, std::vector<int32_t>* out) {
  for (size_t i = 0; i < a.size(); ++i) {
    const json& x = a[i];
    if (!x.is_number_integer()) return type_error(field + "[" + std::to_string(i) + "]", "an integer token id", x);
    int64_t id = x.get<int64_t>();
    if (id < 0 || id >= vocab)
      return invalid_argument("'" + field + "[" + std::to_string(i) + "]' = " + std::to_string(id) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    out->push_back(static_cast<int32_t>(id));
  }
  return Status::ok();
}

Status read_prompt(const json& b, const Tokenizer& tok, int64_t vocab, std::vector<int32_t>* out) {
  if (!b.contains("prompt")) return invalid_argument("'prompt' is required");
  const json& p = b["prompt"];
  if (p.is_string()) {
    *out = tok.encode(p.get<std::string>());
    return Status::ok();
  }
  if (!p.is_array()) return type_error("prompt", "a string, an array of token ids, or a one-element array", p);
  if (p.empty()) return invalid_argument("'prompt' is empty");
  if (p[0].is_number_integer()) return read_token_ids(p, "prompt", vocab, out);
  if (p.size() != 1) return invalid_argument("'prompt' with several prompts is not supported (send one per request)");
  if (p[0].is_string()) {
    *out = tok.encode(p[0].get<std::string>());
    return Status::ok();
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
      msg["content"] = "";
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

}  // namespace

Result<GenerationRequest> parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok,
                                        const ChatTemplate* chat, const RequestLimits& lim, uint64_t default_seed) {
  json b = json::parse(body, nullptr, false);
  if (b.is_discarded()) return invalid_argument("request body is not valid JSON");
  if (!b.is_object()) return invalid_argument("request body must be a JSON object");
  GenerationRequest r;
  r.endpoint = ep;

  if (b.contains("model") && !b["model"].is_null()) {
    if (!b["model"].is_string()) return type_error("model", "a string", b["model"]);
    std::string m = b["model"].get<std::string>();
    if (m != lim.model_name) return not_found("The model '" + m + "' does not exist; this server serves '" + lim.model_name + "'");
  }

  if (ep == Endpoint::completions) {
    AFD_RETURN_IF_ERROR(read_prompt(b, tok, lim.vocab_size, &r.prompt));
    if (b.contains("suffix") && !b["suffix"].is_null()) return invalid_argument("'suffix' is not supported");
    bool echo = false;
    AFD_RETURN_IF_ERROR(read_bool(b, "echo", &echo));
    if (echo) return invalid_argument("'echo' is not supported");
  } else {
    if (!chat) return invalid_argument("this model has no chat template; use /v1/completions");
    AFD_ASSIGN_OR_RETURN(json messages, read_messages(b));
    bool add_generation_prompt = true;
    AFD_RETURN_IF_ERROR(read_bool(b, "add_generation_prompt", &add_generation_prompt));
    json tools = nullptr;
    if (b.contains("tools") && !b["tools"].is_null()) {
      if (!b["tools"].is_array()) return type_error("tools", "an array", b["tools"]);
      tools = b["tools"];
    }
    auto text = chat->render(messages, add_generation_prompt, tools);
    if (!text.ok()) return invalid_argument("chat template: " + text.status().message());
    r.prompt = tok.encode(*text);
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
  const char* max_field = b.contains("max_completion_tokens") && !b["max_completion_tokens"].is_null()
                              ? "max_completion_tokens" : "max_tokens";
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
  int64_t seed = 0;
  bool has_seed = false;
  AFD_RETURN_IF_ERROR(read_int(b, "seed", INT64_MIN, INT64_MAX, &seed, &has_seed));
  r.sampling.seed = has_seed ? static_cast<uint64_t>(seed) : default_seed;
  float pen = 0.0f;
  for (const char* f : {"presence_penalty", "frequency_penalty"}) {
    pen = 0.0f;
    AFD_RETURN_IF_ERROR(read_number(b, f, -2.0, 2.0, &pen));
    if (pen != 0.0f) return invalid_argument("'" + std::string(f) + "' other than 0 is not supported");
  }
  if (b.contains("logit_bias") && !b["logit_bias"].is_null() &&
      !(b["logit_bias"].is_object() && b["logit_bias"].empty()))
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

  if (b.contains("stop") && !b["stop"].is_null()) {
    const json& s = b["stop"];
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
  if (b.contains("stream_options") && !b["stream_options"].is_null()) {
    const json& so = b["stream_options"];
    if (!so.is_object()) return type_error("stream_options", "an object", so);
    if (!r.stream) return invalid_argument("'stream_options' is only allowed when 'stream' is true");
    AFD_RETURN_IF_ERROR(read_bool(so, "include_usage", &r.include_usage));
  }
  AFD_RETURN_IF_ERROR(r.sampling.validate());
  return r;
}

}  // namespace afd::serve
