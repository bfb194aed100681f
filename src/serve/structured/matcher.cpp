#include "serve/structured/matcher.h"

#include <algorithm>
#include <cstring>
#include <iterator>
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

namespace {

enum class Step { ok, dead, bound };

// Steps one stack set through the bytes.
Step step_all(const GrammarAutomaton& a, StackSet cur, std::string_view bytes, StackSet* out) {
  StackSet next;
  for (char c : bytes) {
    if (cur.live.empty()) return Step::dead;
    if (!step_byte(a, cur, static_cast<uint8_t>(c), &next)) return Step::bound;
    std::swap(cur, next);
  }
  if (!cur.alive()) return Step::dead;
  *out = std::move(cur);
  return Step::ok;
}

void keep_first_stacks(StackSet* s) {
  std::sort(s->live.begin(), s->live.end());
  s->live.erase(std::unique(s->live.begin(), s->live.end()), s->live.end());
  if (s->live.size() > kMaxStacks) s->live.resize(kMaxStacks);
}

}  // namespace

bool GrammarMatcher::advance(std::string_view bytes, StackSet* out) const {
  const GrammarAutomaton& a = g_->automaton();
  if (bytes.empty()) {
    *out = stacks_;
    return true;
  }
  const Step all_at_once = step_all(a, stacks_, bytes, out);
  if (all_at_once != Step::bound) return all_at_once == Step::ok;
  // Past a bound with all stacks together: step each stack alone (what the mask decides per stack)
  // and keep the union, cut to the kMaxStacks smallest stacks.
  StackSet all;
  for (const GrammarStack& s : stacks_.live) {
    StackSet one, after;
    one.live.push_back(s);
    if (step_all(a, std::move(one), bytes, &after) != Step::ok) continue;
    all.ended = all.ended || after.ended;
    all.live.insert(all.live.end(), std::make_move_iterator(after.live.begin()),
                    std::make_move_iterator(after.live.end()));
    if (all.live.size() > 4 * kMaxStacks) keep_first_stacks(&all);
  }
  keep_first_stacks(&all);
  if (!all.alive()) return false;
  *out = std::move(all);
  return true;
}

}  // namespace afd::serve
