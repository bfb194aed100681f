// Bounded futures: whether two automaton states behave alike for the next `depth` bytes — the
// bytes a stack frame with that top can consume, where it can end, what it calls and where those
// calls return — which is all a token entry (token_entry.h) depends on when no token is longer than
// `depth` bytes. The positions of a long bounded repetition farther from its bounds than the
// longest token then share one entry (X{0,1000}: ~1000 states, a handful of entries).
#pragma once

#include <cstdint>

#include "serve/structured/grammar_automaton.h"

namespace afd::serve {

// A hash of what the first states reached from `state` (breadth-first, in byte-class order) do.
// States with the same bounded future (same_bounded_future) and the same correspondence of states
// get the same key; a key is a candidate for sharing, never a proof.
uint64_t bounded_future_key(const GrammarAutomaton& a, int32_t state, int32_t depth);

// True only if x and y behave alike for every string of up to `depth` bytes: the pairs of states
// the two reach on the same bytes agree on final, consumes, calls (same callee start, paired
// return states) and which byte classes lead anywhere, where a pair of one state with itself agrees
// on everything after it. The pairs are searched in order of least distance (a call's return pairs
// one byte after the caller when the callee consumes a byte, at the caller's distance otherwise:
// lower bounds). False also (no sharing, still exact) when a state of x's
// side would pair with two states, or past max_pairs pairs. O(pairs x byte classes + a.n_states).
bool same_bounded_future(const GrammarAutomaton& a, int32_t x, int32_t y, int32_t depth, int32_t max_pairs);

}  // namespace afd::serve
