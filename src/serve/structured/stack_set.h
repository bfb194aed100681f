// StackSet: where a byte-level match of a GrammarAutomaton stands — every stack that survives the
// bytes so far (an ambiguous grammar has several), deduplicated, each with a top that consumes
// bytes, and whether some stack has popped to empty (the bytes so far complete the start rule).
// Stacks and their number are bounded (kMaxStackDepth, kMaxStacks): a step that would pass a bound
// fails instead, so a match of request data never takes unbounded memory.
#pragma once

#include <cstdint>
#include <vector>

#include "serve/structured/grammar_automaton.h"

namespace afd::serve {

using GrammarStack = std::vector<int32_t>;  // automaton states, bottom first; the top consumes bytes

inline constexpr size_t kMaxStackDepth = 1024;
inline constexpr size_t kMaxStacks = 1024;

struct StackSet {
  std::vector<GrammarStack> live;  // sorted, unique
  bool ended = false;              // some stack popped to empty (after the last byte stepped)

  bool alive() const { return ended || !live.empty(); }
  bool operator==(const StackSet&) const = default;
};

// The stacks that `s` reaches without consuming a byte (calls pushed, finals popped) added to out
// (unsorted; finish with normalize()). False when a bound was passed.
bool expand_stack(const GrammarAutomaton& a, GrammarStack s, StackSet* out);
// Sorts and deduplicates out->live; false when more than kMaxStacks remain.
bool normalize(StackSet* out);
// The stack set at the start of the grammar (ended: the empty string matches).
StackSet initial_stacks(const GrammarAutomaton& a);
// One byte: out = the stacks of `in` that consume it, expanded. False when a bound was passed (out
// is then unspecified). out->alive() false: the byte is not allowed.
bool step_byte(const GrammarAutomaton& a, const StackSet& in, uint8_t byte, StackSet* out);

}  // namespace afd::serve
