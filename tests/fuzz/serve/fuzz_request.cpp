// libFuzzer target for the serving front end: OpenAI request bodies through
// parse_request (JSON, validation, tokenizer, chat template), and arbitrary chat templates
// through the Jinja interpreter. Input byte 0 picks the mode: bit 0 chat vs completions,
// bit 1 "the rest is a template". Nothing here may crash, hang or abort. Bodies up to the
// default 1 MiB limit are meant (ctest runs it with -max_len=1048577); the bounded JSON parser
// is also checked against nlohmann's own parser on bodies up to 64 KiB.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/api/json_limits.h"
#include "serve/api/request.h"
#include "serve/text/chat_template.h"
#include "serve/text/tokenizer.h"
#include "serve/text/unicode.h"

namespace {

using afd::serve::ChatTemplate;
using afd::serve::Tokenizer;

const char* kTemplate =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

struct State {
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<ChatTemplate> chat;
  State() {
    nlohmann::json vocab = nlohmann::json::object();
    int id = 0;
    for (int b = 0; b < 256; ++b) vocab[afd::serve::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = id++;
    nlohmann::json merges = nlohmann::json::array();
    for (const char* m : {"t h", "th e", "Ġ t", "Ġt h", "Ġth e", "i n", "e r"}) {
      std::string s = m;
      merges.push_back(s);
      std::string joined = s.substr(0, s.find(' ')) + s.substr(s.find(' ') + 1);
      if (!vocab.contains(joined)) vocab[joined] = id++;
    }
    nlohmann::json j = {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
        {"added_tokens", nlohmann::json::array({{{"id", id}, {"content", "<|im_start|>"}, {"special", true}},
                                                {{"id", id + 1}, {"content", "<|im_end|>"}, {"special", true}}})},
        {"pre_tokenizer",
         {{"type", "Split"},
          {"pattern", {{"Regex", afd::serve::split_pattern_regex(afd::serve::SplitPattern::qwen2)}}},
          {"behavior", "Isolated"}}}};
    auto t = Tokenizer::from_json(j.dump());
    if (!t.ok()) __builtin_trap();
    tok = *t;
    auto c = ChatTemplate::from_template(kTemplate, "", "<|im_end|>");
    if (!c.ok()) __builtin_trap();
    chat = std::make_unique<ChatTemplate>(std::move(*c));
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static State st;
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode & 2) {
    // Default parse limits; render budgets small enough that one input runs in milliseconds
    // under ASan (the defaults allow ~1 s of work in Release, far more under ASan).
    afd::serve::jinja::Limits lim;
    lim.max_steps = 200'000;
    lim.max_alloc_bytes = size_t{32} << 20;
    lim.max_output_bytes = size_t{1} << 20;
    lim.max_range = 10'000;
    auto t = ChatTemplate::from_template(rest, {}, {}, lim);
    if (t.ok()) {
      nlohmann::ordered_json msgs = nlohmann::ordered_json::array(
          {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "hi </think> there"}}});
      (void)t->render(msgs, true);
    }
    return 0;
  }
  // Differential check: within the limits, parse_json_bounded gives nlohmann's document
  // (same duplicate-key rule, same key order); what nlohmann refuses, it refuses.
  if (rest.size() <= 65536) {
    auto mine = afd::serve::parse_json_bounded(rest, afd::serve::JsonLimits{});
    const bool limit_hit = !mine.ok() && mine.status().message().find("not valid JSON") == std::string::npos;
    if (!limit_hit) {
      auto ref = nlohmann::ordered_json::parse(rest, nullptr, /*allow_exceptions=*/false);
      if (mine.ok() != !ref.is_discarded()) __builtin_trap();
      const auto h = nlohmann::ordered_json::error_handler_t::replace;
      if (mine.ok() && mine->dump(-1, ' ', false, h) != ref.dump(-1, ' ', false, h)) __builtin_trap();
    }
  }
  afd::serve::RequestLimits lim;
  lim.model_name = "m";
  lim.vocab_size = st.tok->vocab_size();
  lim.max_context = 512;
  auto r = afd::serve::parse_request((mode & 1) ? afd::serve::Endpoint::chat : afd::serve::Endpoint::completions, rest,
                                     *st.tok, st.chat.get(), lim, 1);
  if (r.ok()) {
    // Invariants promised to the scheduler.
    if (r->prompt.empty() || r->max_tokens < 1 ||
        static_cast<int64_t>(r->prompt.size()) + r->max_tokens > lim.max_context)
      __builtin_trap();
    for (int32_t id : r->prompt)
      if (id < 0 || id >= lim.vocab_size) __builtin_trap();
    // Round trip of the tokenizer on text prompts never produces invalid UTF-8.
    std::string text = st.tok->decode(r->prompt);
    if (afd::serve::utf8_sanitize(text) != text) __builtin_trap();
  }
  return 0;
}
