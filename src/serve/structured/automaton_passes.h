// Passes over a GrammarAutomaton after its subset construction (grammar_automaton.cpp runs them in
// this order): drop the states that can never complete, merge states that behave alike, and mark
// the machines a call of which may return without a byte.
#pragma once

#include "serve/structured/grammar_automaton.h"

namespace afd::serve {

// Transitions into dead states and calls into or returning to them removed (states kept).
void drop_dead_states(GrammarAutomaton* a);
// States renumbered, alike ones merged; in_long_repeat and machine_calls carried over.
void merge_equivalent_states(GrammarAutomaton* a);
// Fills machine_nullable.
void mark_nullable_machines(GrammarAutomaton* a);

}  // namespace afd::serve
