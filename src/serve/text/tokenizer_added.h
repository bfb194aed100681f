// AddedTokens: finds the added tokens of a tokenizer.json (its "added_tokens") in text
// the way Hugging Face tokenizers' AddedVocabulary does: leftmost-longest matches, then
// per token single_word (drop the match unless it stands between non-word characters),
// lstrip / rstrip (the match absorbs the white space on its left / right). One instance
// holds either the tokens matched in raw text (normalized=false) or those matched after
// normalization (normalized=true, contents already normalized). Immutable; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "serve/text/tokenizer_regex.h"

namespace afd::serve {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class AddedTokens {
 public:
  // A stretch of text: an added token (id >= 0) or plain text (id = -1).
  struct Segment {
    size_t begin, end;
    int32_t id;
  };

  // tokens: non-empty contents. Equal contents: the first one wins.
  static Result<AddedTokens> build(const std::vector<AddedToken>& tokens);
  bool empty() const { return tokens_.empty(); }

  // Appends to *out the segments that cover text, in order (plain segments non-empty).
  Status split(std::string_view text, std::vector<Segment>* out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // byte -> child node
    int32_t token = -1;                                   // index into tokens_ when a content ends here
  };
  // Longest content starting at text[pos]: index into tokens_, or -1.
  int32_t longest_at(std::string_view text, size_t pos) const;
  Result<bool> is_single_word(std::string_view text, size_t begin, size_t end) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> trie_;
  bool first_byte_[256] = {};
  std::shared_ptr<const Regex> word_char_;  // Rust regex's \w, for single_word
};

}  // namespace afd::serve
