#include "serve/structured/stack_set.h"

#include <algorithm>

namespace afd::serve {

bool expand_stack(const GrammarAutomaton& a, GrammarStack s, StackSet* out) {
  // Moves without consuming can cycle (a nullable call returning to the state that made it), so
  // every stack reached is visited once.
  std::vector<GrammarStack> visited;
  std::vector<GrammarStack> todo;
  todo.push_back(std::move(s));
  while (!todo.empty()) {
    GrammarStack cur = std::move(todo.back());
    todo.pop_back();
    if (cur.empty()) {
      out->ended = true;
      continue;
    }
    const int32_t top = cur.back();
    const bool simple = !a.has_calls(top) && !(a.is_final(top) && cur.size() > 1);
    if (!simple) {
      if (std::find(visited.begin(), visited.end(), cur) != visited.end()) continue;
      if (visited.size() >= 4 * kMaxStacks) return false;
      visited.push_back(cur);
    }
    for (int32_t i = a.call_begin[top]; i < a.call_begin[top + 1]; ++i) {
      const GrammarAutomaton::Call& c = a.calls[i];
      GrammarStack next(cur.begin(), cur.end() - 1);
      if (c.ret >= 0) next.push_back(c.ret);
      next.push_back(c.start);
      if (next.size() > kMaxStackDepth) return false;
      todo.push_back(std::move(next));
    }
    if (a.is_final(top)) {
      if (cur.size() == 1) {
        out->ended = true;
      } else {
        todo.push_back(GrammarStack(cur.begin(), cur.end() - 1));
      }
    }
    if (a.consumes(top)) {
      out->live.push_back(std::move(cur));
      if (out->live.size() > 4 * kMaxStacks) return false;
    }
  }
  return true;
}

bool normalize(StackSet* out) {
  if (out->live.size() > 1) {
    std::sort(out->live.begin(), out->live.end());
    out->live.erase(std::unique(out->live.begin(), out->live.end()), out->live.end());
  }
  return out->live.size() <= kMaxStacks;
}

StackSet initial_stacks(const GrammarAutomaton& a) {
  StackSet s;
  // The root machine's start needs no more than a handful of frames; failure leaves s empty.
  if (!expand_stack(a, GrammarStack{a.root_start}, &s) || !normalize(&s)) return StackSet{};
  return s;
}

bool step_byte(const GrammarAutomaton& a, const StackSet& in, uint8_t byte, StackSet* out) {
  out->live.clear();
  out->ended = false;
  for (const GrammarStack& s : in.live) {
    const int32_t next = a.next(s.back(), byte);
    if (next < 0) continue;
    if (!a.has_calls(next) && !a.is_final(next)) {  // the common case: nothing to expand
      if (!a.consumes(next)) continue;              // as expand_stack: a top that consumes nothing dies
      out->live.push_back(s);
      out->live.back().back() = next;
      continue;
    }
    GrammarStack t = s;
    t.back() = next;
    if (!expand_stack(a, std::move(t), out)) return false;
  }
  return normalize(out);
}

}  // namespace afd::serve
