// TokenEntry: how every token of a vocabulary fares on a stack whose top is one automaton state,
// whatever lies below that top frame — the per-state precomputation behind the token mask.
//
// A token is, for top state s:
// - accepted: the frame of s (with what it calls) consumes all its bytes, so it is allowed on
//   every stack with top s;
// - split: the frame can consume a proper prefix token[0, at) and then end, and the rest
//   token[at, size) must be consumed by the frames below. The frames below decide, per step; when
//   that rest is itself a vocabulary token (`suffix`), the decision is whether the stack below
//   accepts that token, which the stack below's own entry answers (stack_mask.h); splits are
//   grouped by the first byte of their rest, so a byte the stack below refuses drops a group;
// - when the frame can end before any byte (pops_at_start), every token may also be consumed
//   entirely by the stack below;
// - check_on_stack: the local simulation passed a bound (stack_set.h), so only a simulation on
//   the real stack decides;
// - otherwise rejected.
// A bottom entry (the stack has only this frame) has nothing below: no splits, no pops_at_start.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "serve/structured/grammar_automaton.h"
#include "serve/structured/stack_set.h"
#include "serve/structured/token_vocab.h"

namespace afd::serve {

struct TokenEntry {
  struct Split {
    int32_t token;   // a token the frame consumes a proper prefix of, then ends
    int32_t suffix;  // a text token with bytes token[at, size), -1: there is none
    int32_t at;      // 1 <= at < token size
  };

  std::vector<int32_t> accepted_ids;    // sorted; used when accepted_bits is empty
  std::vector<uint64_t> accepted_bits;  // [mask words] when many tokens are accepted
  bool pops_at_start = false;
  // Sorted by (first byte of the rest, suffix, token, at); none of their tokens is accepted.
  std::vector<Split> splits;
  // Where each run of splits whose rests start with the same byte begins, then splits.size().
  std::vector<int32_t> split_groups;
  std::vector<int32_t> split_by_token;  // indices into splits, sorted by (token, at)
  std::vector<int32_t> check_on_stack;  // sorted
  int32_t max_depth = 1;                // deepest stack (from this frame up) the local simulation reached

  bool accepts(int32_t token) const;
  // The splits of one token: [first, last) into split_by_token.
  std::pair<const int32_t*, const int32_t*> splits_of(int32_t token) const;
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
