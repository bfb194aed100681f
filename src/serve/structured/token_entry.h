// TokenEntry: how every token of a vocabulary fares on a stack whose top is one automaton state,
// whatever lies below that top frame — the per-state precomputation behind the token mask.
//
// A token is, for top state s:
// - accepted: the frame of s (with what it calls) consumes all its bytes, so it is allowed on
//   every stack with top s;
// - split at `at`: the frame can consume a proper prefix token[0, at) and then end, and the rest
//   token[at, size) must be consumed by the frames below, which decide per step (stack_mask.h).
//   Splits are kept as trie subtrees (all tokens below a node split at the same `at`), grouped by
//   the first byte of the rest, so a byte the stack below refuses drops a whole group unexpanded;
// - when the frame can end before any byte (pops_at_start), every token may also be consumed
//   entirely by the stack below;
// - check_on_stack: the local simulation passed a bound (stack_set.h), so only a simulation on
//   the real stack decides;
// - otherwise rejected.
// A bottom entry (the stack has only this frame) has nothing below: no splits, no pops_at_start,
// no check_on_stack. Otherwise the two agree: a non-bottom entry serves a bottom frame too.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "serve/structured/grammar_automaton.h"
#include "serve/structured/stack_set.h"
#include "serve/structured/token_vocab.h"

namespace afd::serve {

struct TokenEntry {
  struct SplitRange {
    int32_t from, to;  // trie nodes [from, to): a subtree, or the children of one node
    int32_t at;        // the split of each of their tokens (1 <= at < token size)
    uint8_t first;     // the first byte of each of their rests
  };

  std::vector<int32_t> accepted_ids;    // sorted; used when accepted_bits is empty
  std::vector<uint64_t> accepted_bits;  // [mask words] when many tokens are accepted
  bool pops_at_start = false;
  // Sorted by the first byte of the rest, then in trie order; none of their tokens is accepted.
  std::vector<SplitRange> splits;
  // Where each run of splits whose rests start with the same byte begins, then splits.size().
  std::vector<int32_t> split_groups;
  std::vector<int32_t> split_by_node;   // indices into splits, sorted by (from, at)
  std::vector<int32_t> check_on_stack;  // sorted
  int32_t max_depth = 1;                // deepest stack (from this frame up) the local simulation reached
  bool bottom = false;

  bool accepts(int32_t token) const;
  // The splits of one token (not accepted) into at[0, n) ascending, n returned (at most max_at).
  int32_t splits_of(const TokenVocab& v, int32_t token, int32_t* at, int32_t max_at) const;
  bool check_on_stack_has(int32_t token) const;
  size_t bytes() const;
};

// Walks the vocabulary trie from state `state` of `a`; bottom: the stack has only that frame.
std::unique_ptr<TokenEntry> build_token_entry(const GrammarAutomaton& a, const TokenVocab& v, int32_t state,
                                              bool bottom);
// Sets bit t of mask for every token t whose bytes the whole stack `stack` consumes (one walk of the
// trie simulating that stack; the exact answer where entries cannot be combined).
void or_consumed_by_stack(const GrammarAutomaton& a, const TokenVocab& v, const GrammarStack& stack, uint64_t* mask);

}  // namespace afd::serve
