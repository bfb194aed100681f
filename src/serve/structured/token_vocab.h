// TokenVocab: a tokenizer's vocabulary as a byte trie, built once per tokenizer and shared by every
// grammar. Tokens a grammar may match by their bytes (every token with bytes that is neither
// special nor an end id) are sorted by bytes and stored as a trie in depth-first order, so one
// linear pass walks every token, shares each common prefix, and skips a subtree in one jump.
// Immutable; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serve/text/tokenizer.h"

namespace afd::serve {

class TokenVocab {
 public:
  // end_ids: the ids that end a sequence (EOS / stop tokens). Special tokens other than end_ids are
  // never allowed by a grammar; non-special added tokens match by their bytes. The mask covers
  // [0, tokenizer vocab size).
  static std::shared_ptr<const TokenVocab> build(const Tokenizer& tok, std::vector<int32_t> end_ids);
  // The same with the model's vocabulary size: the mask covers [0, max(n_vocab, end ids + 1)), ids
  // the tokenizer does not have are never allowed.
  static std::shared_ptr<const TokenVocab> build(const Tokenizer& tok, std::vector<int32_t> end_ids, int64_t n_vocab);
  // From explicit token bytes (tests): bytes[id]; ids in `never` are never allowed.
  static std::shared_ptr<const TokenVocab> from_bytes(std::vector<std::string> bytes, std::vector<int32_t> end_ids,
                                                      std::vector<int32_t> never = {});

  int64_t vocab_size() const { return n_vocab_; }
  int64_t mask_words() const { return (n_vocab_ + 63) / 64; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  bool is_end(int32_t id) const { return id >= 0 && id < n_vocab_ && kind_[id] == kEnd; }
  // Whether id is matched by its bytes (a grammar may allow it).
  bool is_text(int32_t id) const { return id >= 0 && id < n_vocab_ && kind_[id] == kText; }
  std::string_view bytes(int32_t id) const { return bytes_[id]; }
  // A text token whose bytes are exactly `b` (the smallest such id), or -1 when there is none.
  int32_t find(std::string_view b) const;
  // find() of the one byte b.
  int32_t byte_token(uint8_t b) const { return byte_token_[b]; }
  // find() of bytes(token_ids()[k]) without its first `at` bytes, for 1 <= at < its size: by the
  // token's position k in trie order (precomputed, stored in that order).
  int32_t suffix_at(int32_t k, int32_t at) const { return suffix_ids_[suffix_begin_[k] + at - 1]; }
  // The same by token id, for a text token.
  int32_t suffix_token(int32_t id, int32_t at) const { return suffix_at(token_pos_[id], at); }
  // The trie node a text token's bytes end at.
  int32_t token_node(int32_t id) const { return token_node_[id]; }

  // The trie, in depth-first order: node i stands for the byte node_byte[i] at depth node_depth[i]
  // (1 for a first byte) below the nearest earlier node of depth node_depth[i] - 1; its subtree is
  // [i, node_end[i]); the tokens whose bytes end at it are token_ids[node_tokens[i] ..
  // node_tokens[i + 1]).
  int32_t n_nodes() const { return static_cast<int32_t>(node_byte_.size()); }
  const std::vector<uint8_t>& node_byte() const { return node_byte_; }
  const std::vector<int32_t>& node_depth() const { return node_depth_; }
  const std::vector<int32_t>& node_end() const { return node_end_; }
  const std::vector<int32_t>& node_tokens() const { return node_tokens_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  int32_t max_depth() const { return max_depth_; }

 private:
  enum Kind : uint8_t { kNever = 0, kText = 1, kEnd = 2 };
  TokenVocab() = default;
  void build_trie();
  void build_suffixes();

  int64_t n_vocab_ = 0;
  std::vector<std::string> bytes_;  // [n_vocab]; "" where none
  std::vector<uint8_t> kind_;       // [n_vocab]
  std::vector<int32_t> end_ids_;
  std::vector<uint8_t> node_byte_;
  std::vector<int32_t> node_depth_, node_end_, node_tokens_, token_ids_;
  int32_t max_depth_ = 0;
  std::array<int32_t, 256> byte_token_{};
  std::vector<int64_t> suffix_begin_;  // [token_ids size]: where a token's suffixes start in suffix_ids_
  std::vector<int32_t> suffix_ids_;
  std::vector<int32_t> token_node_;  // [n_vocab], -1 for tokens that are not text
  std::vector<int32_t> token_pos_;   // [n_vocab]: index into token_ids_, -1 for tokens that are not text
};

}  // namespace afd::serve
