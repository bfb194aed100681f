// libFuzzer target for chat templates: arbitrary template source (and optionally the
// messages it renders) through afd's Jinja engine, as a model's tokenizer_config.json
// and a client's request would bring them. Nothing may crash, hang, overflow the stack or
// exceed the engine's limits.
//
// Input: byte 0 = flags (bit 0 add_generation_prompt, bit 1 pass tools, bit 2 the
// default limits rather than the fuzzing ones), then the template source; a NUL byte ends
// the template, and what follows it is the messages as JSON (fixed messages otherwise).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/text/chat_template.h"
#include "serve/text/jinja.h"

namespace {

using json = nlohmann::ordered_json;

const json& default_messages() {
  static const json m = json::parse(R"([
    {"role": "system", "content": "You are helpful.\n"},
    {"role": "user", "content": "Hi <think>x</think> é 中 \u00a0 'q' \"d\""},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "assistant", "content": "<think>\nok\n</think>\n\nIt is sunny.", "reasoning_content": "r"},
    {"role": "user", "content": [{"type": "text", "text": "part"}]}
  ])");
  return m;
}

const json& tools() {
  static const json t = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "default": 1},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["city"]}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  size_t nul = rest.find('\0');
  std::string source = rest.substr(0, nul);
  json messages = default_messages();
  if (nul != std::string::npos) {
    json m = json::parse(rest.substr(nul + 1), nullptr, false);
    if (!m.is_discarded()) messages = std::move(m);
  }
  // Parse limits stay the defaults (the point is that they bound recursion under ASan's
  // larger frames); render budgets are smaller so that one input runs in milliseconds.
  afd::serve::jinja::Limits lim;
  if (!(flags & 4)) {
    lim.max_steps = 200'000;
    lim.max_alloc_bytes = size_t{32} << 20;
    lim.max_output_bytes = size_t{1} << 20;
    lim.max_range = 10'000;
  }
  auto ct = afd::serve::ChatTemplate::from_template(source, "<s>", "</s>", lim);
  if (!ct.ok()) {
    if (ct.status().message().empty()) __builtin_trap();  // every refusal says why
    return 0;
  }
  auto r = ct->render(messages, flags & 1, (flags & 2) ? tools() : json(nullptr));
  if (r.ok() && r->size() > lim.max_output_bytes) __builtin_trap();
  if (!r.ok() && r.status().message().empty()) __builtin_trap();
  return 0;
}
