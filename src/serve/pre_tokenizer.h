// Hand-written matchers for the regex split patterns of byte-level BPE tokenizers
// (std::regex has no \p{L}). Each returns the pieces of `text` in order; concatenated
// they give back `text` exactly.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace afd::serve {

enum class SplitPattern {
  // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  gpt2,
  // Qwen2 / Qwen3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
  //                 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  qwen2,
  // Llama 3 / DeepSeek-style: as qwen2 but \p{N}{1,3}.
  llama3,
};

// Recognises a pattern string from tokenizer.json; not_supported for anything else.
Result<SplitPattern> split_pattern_from_regex(const std::string& regex);
const char* split_pattern_regex(SplitPattern p);

std::vector<std::string_view> pre_tokenize(std::string_view text, SplitPattern p);

}  // namespace afd::serve
