// Regex: a regular expression from a tokenizer.json (Split / Replace patterns), compiled
// once with PCRE2 in UTF-8 mode with Unicode properties (\p{L}, \p{N}, ...), JIT-compiled
// when the platform has PCRE2's JIT. Hugging Face tokenizers run these patterns with
// Oniguruma; compile() rewrites the escapes whose meaning differs between the two engines
// (\s, \S, \w, \W, \h, \H) into explicit Unicode sets, makes ^ and $ line anchors as in
// Oniguruma, and refuses what PCRE2 would read differently (nested classes, class
// intersection with &&). Matching is bounded: every match attempt has a match limit and a
// heap limit, and running past one is an error (out_of_range), never a hang.
// Immutable after compile(); find() is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace afd::serve {

class Regex {
 public:
  // Byte offsets [first, second) of one match.
  using Span = std::pair<size_t, size_t>;

  // pattern: an Oniguruma-syntax regex (literal=false) or a plain string matched as is
  // (literal=true, Hugging Face's {"String": ...} patterns). Errors name the pattern and
  // PCRE2's message with the offset.
  static Result<std::shared_ptr<const Regex>> compile(std::string_view pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends to *out the successive non-overlapping leftmost-first matches in text, the
  // way Oniguruma's (and Rust regex's) find_iter yields them: after an empty match the
  // search moves on by one character, and an empty match right where the previous match
  // ended is skipped. text must be valid UTF-8 (not re-checked).
  Status find_all(std::string_view text, std::vector<Span>* out) const;
  // Whether the pattern matches at text[pos] (anchored there; lookbehind sees text[..pos]).
  Result<bool> matches_at(std::string_view text, size_t pos) const;

  const std::string& pattern() const { return source_; }
  // The pattern as handed to PCRE2 (after the Oniguruma rewrite).
  const std::string& compiled_pattern() const { return translated_; }
  bool jit() const { return jit_; }

  // Limits applied to every match attempt (PCRE2 match limit and heap limit in KiB).
  static constexpr uint32_t kMatchLimit = 10'000'000;
  static constexpr uint32_t kHeapLimitKiB = 64 * 1024;

 private:
  Regex() = default;
  Status match_error(int rc) const;

  std::string source_, translated_;
  void* code_ = nullptr;   // pcre2_code_8*
  void* mctx_ = nullptr;   // pcre2_match_context_8*
  bool jit_ = false;
};

// Rewrites an Oniguruma pattern into PCRE2 syntax with the same meaning (see above);
// not_supported for constructs PCRE2 would read differently. Exposed for tests.
Result<std::string> onig_to_pcre2(std::string_view pattern);

}  // namespace afd::serve
