// libFuzzer target for GBNF grammars (serve/structured/): request data that reaches parse_gbnf,
// the byte automaton, the token entries and the mask. The input is GBNF text, optionally followed
// by a 0xff byte and bytes that steer a short walk. A grammar that parses is compiled against a
// small vocabulary (every byte, fragments that close several levels at once, multi-byte UTF-8
// pieces) and walked: at each step the mask must equal accepting each token on a copy of the
// matcher (the brute-force oracle), and the end id must be allowed exactly when the grammar can
// end. Nothing may crash, hang, or disagree. Limits are smaller than a server's so each input
// stays fast.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serve/structured/compiled_grammar.h"
#include "serve/structured/gbnf.h"
#include "serve/structured/matcher.h"
#include "serve/structured/token_vocab.h"

namespace {

using afd::serve::CompiledGrammar;
using afd::serve::GrammarLimits;
using afd::serve::GrammarMatcher;
using afd::serve::TokenVocab;

const std::shared_ptr<const TokenVocab>& vocab() {
  static const std::shared_ptr<const TokenVocab> v = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* s :
         {"{\"",  "\":",    "\",",   "\"}",      "\"]",    "}}",   "},",     "]]",   "],",  "[[",   "[{",      "{}",
          "[]",   "true",   "false", "null",     "12",     "0.",   "e+",     "-1",   " \"", "\n  ", "  ",      "\\n",
          "\\\"", "\\u00",  "ab",    "abc",      "aa",     "((",   "))",     "()",   "\"a", "a\"",  "x\"}",    "é",
          "\xC3", "\xA9\"", "😀",     "\xF0\x9F", "αβ",     "ω\"",  " }",     "}]",   "]}",  "\"]}", "\"},{\"", "1,",
          "2]",   "0}",     " ,",    ",\n",      "\", \"", "}}]",  "]],",    "a\",", " a",  ")))",  "a)",      "a].",
          "\n}",  "\n]",    "e\"",   "ab\"}",    "5}}",    "3],[", "}, {\"", "x\")"})
      bytes.push_back(s);
    return TokenVocab::from_bytes(std::move(bytes), {static_cast<int32_t>(bytes.size())});
  }();
  return v;
}

void fail(const std::string& what, std::string_view gbnf) {
  std::fprintf(stderr, "%s\ngrammar:\n%.*s\n", what.c_str(), static_cast<int>(gbnf.size()), gbnf.data());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t cut = all.find('\xff');
  const std::string_view gbnf = all.substr(0, cut);
  const std::string_view steer = cut == std::string_view::npos ? std::string_view() : all.substr(cut + 1);
  GrammarLimits limits;
  limits.max_text_bytes = 4096;
  limits.max_rules = 200;
  limits.max_elements = 20000;
  limits.max_automaton_states = 4000;
  auto grammar = afd::serve::parse_gbnf(gbnf, limits);
  if (!grammar.ok()) {
    if (grammar.status().message().empty()) fail("an error without a message", gbnf);
    return 0;
  }
  auto compiled = CompiledGrammar::compile(*grammar, vocab());
  if (!compiled.ok()) fail("compile failed: " + compiled.status().to_string(), gbnf);
  const TokenVocab& v = *vocab();
  const int32_t end_id = v.end_ids()[0];
  GrammarMatcher m(*compiled);
  std::vector<uint64_t> mask(static_cast<size_t>(m.mask_words()));
  uint32_t rng = 2166136261u;
  for (char c : all) rng = (rng ^ static_cast<uint8_t>(c)) * 16777619u;
  std::string text;  // bytes accepted so far
  // The oracle steps the whole stack set once per token; a hugely ambiguous grammar holds
  // kMaxStacks stacks, so the walk stops after a time budget (the checks done still count).
  const auto start = std::chrono::steady_clock::now();
  for (size_t step = 0; step < 12 && !m.is_finished(); ++step) {
    if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(500)) break;
    m.fill_next_token_mask(mask.data());
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < v.vocab_size(); ++t) {
      const bool bit = (mask[t >> 6] >> (t & 63)) & 1;
      GrammarMatcher copy = m;
      if (bit != copy.accept_token(t) || bit != m.is_allowed(t))
        fail("after '" + text + "': token " + std::to_string(t) + " '" + std::string(v.bytes(t)) + "' mask " +
                 std::to_string(bit) + " disagrees with accepting it",
             gbnf);
      if (bit && t != end_id) allowed.push_back(t);
    }
    if (((mask[end_id >> 6] >> (end_id & 63)) & 1) != m.can_end()) fail("end id bit differs from can_end()", gbnf);
    if (m.must_end() && !allowed.empty()) fail("must_end() with tokens allowed", gbnf);
    if (allowed.empty()) break;
    const uint8_t s = step < steer.size() ? static_cast<uint8_t>(steer[step]) : static_cast<uint8_t>(rng >> 24);
    rng = rng * 1103515245u + 12345u;
    const int32_t t = allowed[(s + (rng >> 16)) % allowed.size()];
    if (!m.accept_token(t)) fail("an allowed token was refused", gbnf);
    text += v.bytes(t);
  }
  return 0;
}
