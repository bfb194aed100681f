#include "serve/structured/token_vocab.h"

#include <algorithm>
#include <numeric>

namespace afd::serve {

std::shared_ptr<const TokenVocab> TokenVocab::build(const Tokenizer& tok, std::vector<int32_t> end_ids) {
  return build(tok, std::move(end_ids), tok.vocab_size());
}

std::shared_ptr<const TokenVocab> TokenVocab::build(const Tokenizer& tok, std::vector<int32_t> end_ids,
                                                    int64_t n_vocab) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max<int64_t>(n_vocab, 0)));
  std::vector<int32_t> never;
  for (int64_t id = 0; id < n_vocab && id < tok.vocab_size(); ++id) {
    const int32_t i = static_cast<int32_t>(id);
    if (tok.is_special(i)) {
      never.push_back(i);
    } else {
      bytes[id] = tok.token_bytes(i);
    }
  }
  return from_bytes(std::move(bytes), std::move(end_ids), std::move(never));
}

std::shared_ptr<const TokenVocab> TokenVocab::from_bytes(std::vector<std::string> bytes, std::vector<int32_t> end_ids,
                                                         std::vector<int32_t> never) {
  std::shared_ptr<TokenVocab> v(new TokenVocab());
  int64_t n = static_cast<int64_t>(bytes.size());
  for (int32_t e : end_ids) n = std::max<int64_t>(n, int64_t{e} + 1);
  bytes.resize(static_cast<size_t>(n));
  v->n_vocab_ = n;
  v->kind_.assign(static_cast<size_t>(n), kNever);
  for (int64_t id = 0; id < n; ++id)
    if (!bytes[id].empty()) v->kind_[id] = kText;
  for (int32_t id : never)
    if (id >= 0 && id < n) v->kind_[id] = kNever;
  for (int32_t id : end_ids)
    if (id >= 0) v->kind_[id] = kEnd;
  std::sort(end_ids.begin(), end_ids.end());
  end_ids.erase(std::unique(end_ids.begin(), end_ids.end()), end_ids.end());
  end_ids.erase(std::remove_if(end_ids.begin(), end_ids.end(), [](int32_t e) { return e < 0; }), end_ids.end());
  v->end_ids_ = std::move(end_ids);
  v->bytes_ = std::move(bytes);
  v->build_trie();
  v->build_suffixes();
  return v;
}

int32_t TokenVocab::find(std::string_view b) const {
  // token_ids_ is sorted by (bytes, id).
  auto it = std::lower_bound(token_ids_.begin(), token_ids_.end(), b,
                             [&](int32_t id, std::string_view key) { return std::string_view(bytes_[id]) < key; });
  return it != token_ids_.end() && bytes_[*it] == b ? *it : -1;
}

void TokenVocab::build_suffixes() {
  // Polynomial hashes, each suffix's from the next one's (h(b[i..]) = b[i] + B * h(b[i+1..])), in an
  // open-addressing table of the text tokens (trie order: of equal bytes, the smallest id first).
  constexpr uint64_t kB = 0x100000001B3ull;
  auto hash = [](std::string_view b) {
    uint64_t h = 0;
    for (size_t i = b.size(); i-- > 0;) h = static_cast<uint8_t>(b[i]) + kB * h;
    return h;
  };
  auto mix = [](uint64_t h) {
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
  };
  size_t cap = 16;
  while (cap < 2 * token_ids_.size()) cap *= 2;
  std::vector<int32_t> slot(cap, -1);
  std::vector<uint64_t> slot_hash(cap);
  auto find_slot = [&](uint64_t h, std::string_view b) {
    size_t i = mix(h) & (cap - 1);
    while (slot[i] >= 0 && !(slot_hash[i] == h && std::string_view(bytes_[slot[i]]) == b)) i = (i + 1) & (cap - 1);
    return i;
  };
  for (int32_t id : token_ids_) {
    const uint64_t h = hash(bytes_[id]);
    const size_t i = find_slot(h, bytes_[id]);
    if (slot[i] < 0) slot[i] = id, slot_hash[i] = h;
  }
  token_pos_.assign(static_cast<size_t>(n_vocab_), -1);
  suffix_begin_.resize(token_ids_.size());
  int64_t n = 0;
  for (size_t k = 0; k < token_ids_.size(); ++k) {
    token_pos_[token_ids_[k]] = static_cast<int32_t>(k);
    suffix_begin_[k] = n;
    n += static_cast<int64_t>(bytes_[token_ids_[k]].size()) - 1;
  }
  suffix_ids_.resize(static_cast<size_t>(n));
  for (size_t k = 0; k < token_ids_.size(); ++k) {
    const std::string_view b = bytes_[token_ids_[k]];
    uint64_t h = 0;
    for (size_t at = b.size(); at-- > 1;) {
      h = static_cast<uint8_t>(b[at]) + kB * h;
      suffix_ids_[suffix_begin_[k] + at - 1] = slot[find_slot(h, b.substr(at))];
    }
  }
}

void TokenVocab::build_trie() {
  std::vector<int32_t> order;
  for (int64_t id = 0; id < n_vocab_; ++id)
    if (kind_[id] == kText) order.push_back(static_cast<int32_t>(id));
  std::sort(order.begin(), order.end(),
            [&](int32_t x, int32_t y) { return bytes_[x] != bytes_[y] ? bytes_[x] < bytes_[y] : x < y; });
  token_node_.assign(static_cast<size_t>(n_vocab_), -1);
  std::vector<int32_t> path;  // node of each depth along the current token (path[d - 1]: depth d)
  std::string_view prev;
  node_tokens_.clear();
  for (int32_t id : order) {
    std::string_view b = bytes_[id];
    size_t common = 0;
    while (common < prev.size() && common < b.size() && prev[common] == b[common]) ++common;
    // Close the nodes below the common prefix.
    while (path.size() > common) {
      node_end_[path.back()] = n_nodes();
      path.pop_back();
    }
    for (size_t d = common; d < b.size(); ++d) {
      path.push_back(n_nodes());
      node_byte_.push_back(static_cast<uint8_t>(b[d]));
      node_depth_.push_back(static_cast<int32_t>(d + 1));
      node_end_.push_back(-1);
      node_tokens_.push_back(static_cast<int32_t>(token_ids_.size()));
    }
    // Tokens arrive sorted, so the node's tokens are contiguous and come right after its creation
    // (or after an equal token); node_tokens_[i + 1] is fixed when node i + 1 is created.
    token_node_[id] = path.back();  // where b ends
    token_ids_.push_back(id);
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(b.size()));
    prev = b;
  }
  while (!path.empty()) {
    node_end_[path.back()] = n_nodes();
    path.pop_back();
  }
  node_tokens_.push_back(static_cast<int32_t>(token_ids_.size()));
  for (int b = 0; b < 256; ++b) byte_token_[b] = find(std::string(1, static_cast<char>(b)));
}

}  // namespace afd::serve
