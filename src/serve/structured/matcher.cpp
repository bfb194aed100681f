#include "serve/structured/matcher.h"

#include <cstring>
#include <utility>
#include <vector>

#include "serve/structured/stack_mask.h"

namespace afd::serve {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> g)
    : g_(std::move(g)), stacks_(initial_stacks(g_->automaton())) {}

void GrammarMatcher::fill_next_token_mask(uint64_t* mask) const {
  const int64_t n_words = mask_words();
  std::memset(mask, 0, static_cast<size_t>(n_words) * sizeof(uint64_t));
  if (finished_) return;
  for (const GrammarStack& s : stacks_.live) or_stack_mask(*g_, s, mask);
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
