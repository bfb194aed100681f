// Test helper: a byte-level BPE tokenizer with no merges, so token id == byte value, and one
// special token, 256 = <|im_end|> (vocabulary 257).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/text/tokenizer.h"
#include "serve/text/unicode.h"

namespace afd::serve::testing {

inline std::shared_ptr<const Tokenizer> bytes_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                      {"added_tokens", nlohmann::json::array({{{"id", 256}, {"content", "<|im_end|>"}, {"special", true}}})},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}}};
  return *Tokenizer::from_json(j.dump());
}

}  // namespace afd::serve::testing
