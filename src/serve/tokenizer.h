// Tokenizer: Hugging Face tokenizer.json with a byte-level BPE model (GPT-2 / Qwen /
// DeepSeek / Llama 3 families): added and special tokens are matched first, the rest is
// split by the pre-tokenizer pattern, mapped byte -> printable character and merged by
// rank. Immutable after load; encode/decode are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "serve/pre_tokenizer.h"

namespace afd::serve {

class Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names the file in error messages.
  static Result<std::shared_ptr<const Tokenizer>> from_json(const std::string& json_text,
                                                           const std::string& source = "tokenizer.json");
  static Result<std::shared_ptr<const Tokenizer>> load(const std::string& path);

  // Token ids for `text`. Added/special tokens written literally in text are recognised.
  std::vector<int32_t> encode(std::string_view text) const;
  // The raw bytes a token stands for (may be a partial UTF-8 sequence). Special tokens
  // give their content; ids outside the vocabulary give "".
  const std::string& token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;
  // Concatenated bytes of the tokens, invalid UTF-8 replaced by U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;
  // Id of a token by its exact vocabulary string (added tokens by content), or -1.
  int32_t token_id(const std::string& token) const;
  // One past the largest token id.
  int64_t vocab_size() const { return static_cast<int64_t>(id_bytes_.size()); }
  SplitPattern split_pattern() const { return pattern_; }

 private:
  Tokenizer() = default;
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>* out) const;

  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  struct Added {
    std::string content;
    int32_t id;
  };
  SplitPattern pattern_ = SplitPattern::qwen2;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> vocab_;   // byte-level token string -> id
  std::unordered_map<uint64_t, Merge> merges_;       // (left << 32 | right) -> merge
  std::vector<int32_t> byte_token_;                  // [256] byte -> token id
  std::vector<std::string> id_bytes_;                // id -> decoded bytes
  std::vector<uint8_t> special_;                     // id -> is special
  std::vector<Added> added_;                         // longest content first
  bool added_first_[256] = {};                       // first bytes of added tokens
};

// Streaming detokenizer for one sequence: turns tokens into text chunks that are always
// complete UTF-8 (a code point split across tokens is held until its last byte arrives).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tok, bool skip_special = true) : tok_(tok), skip_special_(skip_special) {}
  // Returns the text that became complete with this token (possibly "").
  std::string add(int32_t token);
  // Returns whatever is left; an incomplete trailing sequence becomes U+FFFD.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace afd::serve
