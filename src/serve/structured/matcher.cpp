#include "serve/structured/matcher.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace afd::serve {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> g)
    : g_(std::move(g)), stacks_(initial_stacks(g_->automaton())) {}

void GrammarMatcher::fill_next_token_mask(uint64_t* mask) const {
  const int64_t n_words = mask_words();
  std::memset(mask, 0, static_cast<size_t>(n_words) * sizeof(uint64_t));
  if (finished_) return;
  // Per distinct (top, bottom): OR the context-free part once; then the context-dependent tokens
  // of each stack against that stack.
  struct Used {
    int32_t key;
    const CompiledGrammar::TokenEntry* entry;
  };
  Used used[8];
  int n_used = 0;
  for (const GrammarStack& s : stacks_.live) {
    const bool bottom = s.size() == 1;
    const CompiledGrammar::TokenEntry& e = g_->token_entry(s.back(), bottom);
    if (s.size() - 1 + static_cast<size_t>(e.max_depth) > kMaxStackDepth) {
      g_->or_allowed_full(s, mask);
      continue;
    }
    const int32_t key = s.back() * 2 + bottom;
    bool seen = false;
    for (int i = 0; i < n_used; ++i) seen = seen || used[i].key == key;
    if (seen) {
      // Same entry as an earlier stack: only its context-dependent tokens differ.
    } else {
      if (n_used < 8) used[n_used++] = {key, &e};
      if (!e.accepted_bits.empty()) {
        const uint64_t* b = e.accepted_bits.data();
        for (int64_t w = 0; w < n_words; ++w) mask[w] |= b[w];
      } else {
        for (int32_t t : e.accepted_ids) mask[t >> 6] |= uint64_t{1} << (t & 63);
      }
    }
    for (int32_t t : e.context_dependent) {
      if ((mask[t >> 6] >> (t & 63)) & 1) continue;
      if (g_->stack_accepts(s, g_->vocab().bytes(t))) mask[t >> 6] |= uint64_t{1} << (t & 63);
    }
  }
  if (stacks_.ended)
    for (int32_t t : g_->vocab().end_ids()) mask[t >> 6] |= uint64_t{1} << (t & 63);
}

bool GrammarMatcher::is_allowed(int32_t token) const {
  if (finished_) return false;
  const TokenVocab& v = g_->vocab();
  if (v.is_end(token)) return stacks_.ended;
  if (!v.is_text(token)) return false;
  StackSet out;
  return advance(v.bytes(token), &out);
}

bool GrammarMatcher::accept_token(int32_t token) {
  if (finished_) return false;
  const TokenVocab& v = g_->vocab();
  if (v.is_end(token)) {
    if (!stacks_.ended) return false;
    finished_ = true;
    return true;
  }
  if (!v.is_text(token)) return false;
  return accept_bytes(v.bytes(token));
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  StackSet out;
  if (!advance(bytes, &out)) return false;
  stacks_ = std::move(out);
  return true;
}

bool GrammarMatcher::advance(std::string_view bytes, StackSet* out) const {
  const GrammarAutomaton& a = g_->automaton();
  if (bytes.empty()) {
    *out = stacks_;
    return true;
  }
  StackSet cur = stacks_, next;
  for (char c : bytes) {
    if (cur.live.empty()) return false;
    if (!step_byte(a, cur, static_cast<uint8_t>(c), &next)) return false;
    std::swap(cur, next);
  }
  if (!cur.alive()) return false;
  *out = std::move(cur);
  return true;
}

}  // namespace afd::serve
