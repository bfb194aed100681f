#include "serve/text/tokenizer_added.h"

#include <algorithm>

#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

// Rust regex's Unicode \w, which HF tokenizers use to decide single_word.
const char* kWordChar = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";

// Start of the white-space run that ends text (text.size() when none).
size_t trailing_space_start(std::string_view text) {
  size_t i = text.size();
  while (i > 0) {
    size_t k = i - 1;
    while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
    size_t len;
    if (!is_whitespace(utf8_decode(text, k, &len))) break;
    i = k;
  }
  return i;
}

// Length of the white-space run that starts text.
size_t leading_space_length(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t len;
    if (!is_whitespace(utf8_decode(text, i, &len))) break;
    i += len;
  }
  return i;
}

}  // namespace

Result<AddedTokens> AddedTokens::build(const std::vector<AddedToken>& tokens) {
  AddedTokens a;
  a.trie_.emplace_back();
  bool need_word = false;
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) return invalid_argument("added token " + std::to_string(t.id) + " has empty content");
    int32_t node = 0;
    for (char ch : t.content) {
      auto c = static_cast<unsigned char>(ch);
      auto& nx = a.trie_[node].next;
      auto it = std::find_if(nx.begin(), nx.end(), [c](const auto& p) { return p.first == c; });
      if (it != nx.end()) {
        node = it->second;
      } else {
        int32_t child = static_cast<int32_t>(a.trie_.size());
        a.trie_[node].next.emplace_back(c, child);
        a.trie_.emplace_back();
        node = child;
      }
    }
    if (a.trie_[node].token >= 0) continue;
    a.trie_[node].token = static_cast<int32_t>(a.tokens_.size());
    a.tokens_.push_back(t);
    a.first_byte_[static_cast<unsigned char>(t.content[0])] = true;
    need_word |= t.single_word;
  }
  if (need_word) {
    AFD_ASSIGN_OR_RETURN(a.word_char_, Regex::compile(kWordChar));
  }
  return a;
}

int32_t AddedTokens::longest_at(std::string_view text, size_t pos) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    const auto& nx = trie_[node].next;
    auto it = std::find_if(nx.begin(), nx.end(), [c](const auto& p) { return p.first == c; });
    if (it == nx.end()) break;
    node = it->second;
    if (trie_[node].token >= 0) best = trie_[node].token;
  }
  return best;
}

Result<bool> AddedTokens::is_single_word(std::string_view text, size_t begin, size_t end) const {
  if (begin > 0) {
    size_t k = begin - 1;
    while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
    AFD_ASSIGN_OR_RETURN(bool word_before, word_char_->matches_at(text.substr(0, begin), k));
    if (word_before) return false;
  }
  if (end < text.size()) {
    AFD_ASSIGN_OR_RETURN(bool word_after, word_char_->matches_at(text, end));
    if (word_after) return false;
  }
  return true;
}

Status AddedTokens::split(std::string_view text, std::vector<Segment>* out) const {
  const size_t n = text.size();
  size_t done = 0;  // text before this is emitted
  size_t pos = 0;   // where the search for the next match starts
  while (pos < n) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t t = longest_at(text, pos);
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[t];
    size_t begin = pos, end = pos + tok.content.size();
    pos = end;  // a dropped match is still consumed, as in HF's non-overlapping iteration
    if (tok.single_word) {
      AFD_ASSIGN_OR_RETURN(bool single, is_single_word(text, begin, end));
      if (!single) continue;
    }
    if (tok.lstrip) begin = std::max(trailing_space_start(text.substr(0, begin)), done);
    if (tok.rstrip) end += leading_space_length(text.substr(end));
    if (done < begin) out->push_back({done, begin, -1});
    out->push_back({begin, end, tok.id});
    done = end;
    pos = std::max(pos, end);
  }
  if (done < n) out->push_back({done, n, -1});
  return Status();
}

}  // namespace afd::serve
