// Pre-tokenizer of a Hugging Face tokenizer.json: the pipeline that cuts (normalized)
// text into the pieces BPE merges within. Supported steps, with the semantics of HF
// tokenizers: Split (Regex or String pattern, behavior Isolated / Removed /
// MergedWithPrevious / MergedWithNext / Contiguous, invert), Digits (individual_digits),
// ByteLevel (add_prefix_space; use_regex with the GPT-2 pattern) and Sequence of these.
// Regexes are compiled once at load (tokenizer_regex.h). Immutable; thread-safe.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "serve/text/tokenizer_regex.h"

namespace afd::serve {

// Split patterns of well-known tokenizers, for writers and tests.
enum class SplitPattern {
  // GPT-2 (also ByteLevel's use_regex): 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  gpt2,
  // Qwen2 / Qwen3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
  //                 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  qwen2,
  // Llama 3: as qwen2 but \p{N}{1,3}.
  llama3,
};
const char* split_pattern_regex(SplitPattern p);

// What a Split does with the matches (HF SplitDelimiterBehavior).
enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };
// "Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous".
Result<SplitBehavior> split_behavior_from_name(std::string_view name);

// HF NormalizedString::split of text by the matches of re (invert: the non-matching gaps
// play the part of the matches). Appends the resulting non-empty pieces, as views into
// text, to *out. Errors: the regex ran past its match limit.
Status split_pieces(std::string_view text, const Regex& re, SplitBehavior behavior, bool invert,
                    std::vector<std::string_view>* out);

class PreTokenizer {
 public:
  // node: tokenizer.json's "pre_tokenizer" (null or absent: no splitting). Errors name
  // `where` and the unsupported component.
  static Result<PreTokenizer> from_json(const nlohmann::json& node, const std::string& where);

  // Cuts text into pieces, in order. A piece is a view into text, or into a string
  // appended to *arena when a step changed it (ByteLevel's add_prefix_space). Empty
  // pieces are dropped.
  Status split(std::string_view text, std::vector<std::string_view>* pieces, std::deque<std::string>* arena) const;

 private:
  struct Step {
    std::shared_ptr<const Regex> re;  // null: no splitting (ByteLevel with use_regex=false)
    SplitBehavior behavior = SplitBehavior::isolated;
    bool invert = false;
    bool add_prefix_space = false;    // ByteLevel: prepend ' ' to pieces not starting with one
  };
  Status add_steps(const nlohmann::json& node, const std::string& where);

  std::vector<Step> steps_;
};

}  // namespace afd::serve
