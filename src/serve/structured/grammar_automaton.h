// GrammarAutomaton: a grammar as deterministic byte automata that call each other (a recursive
// transition network). Each "machine" is the DFA of one rule with every non-recursive rule it
// references inlined; a reference to a recursive rule (or one past the inlining depth) stays a call.
// A grammar without recursion is one machine, so matching it needs no stack. States of all machines
// share one numbering.
//
// Every state can still complete: states from which their machine can never end (an alternative
// with an empty class) are dropped, and equivalent states are merged.
//
// Matching semantics (stack_set.h): a stack is a list of states, bottom first; its top consumes
// bytes through next(); a top with calls may also push the callee's start (the top becoming the
// call's return state); a final top may pop. A stack that pops to empty has matched the grammar.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/status.h"

namespace afd::serve {

class Grammar;
struct GrammarLimits;

// Repetitions of at least this many copies mark their states in_long_repeat (below).
inline constexpr int32_t kLongRepeatCopies = 64;

struct GrammarAutomaton {
  struct Call {
    int32_t start;  // the callee machine's start state
    int32_t ret;    // state the caller continues in; -1: nothing follows (the caller's frame is dropped)
  };

  int32_t n_states = 0;
  int32_t n_classes = 0;                  // byte equivalence classes
  std::array<uint8_t, 256> byte_class{};  // byte -> class
  std::vector<int32_t> next_;             // [n_states * n_classes] -> state, -1: dead
  std::vector<uint8_t> final_;            // [n_states]: the machine may end (pop) here
  std::vector<uint8_t> consumes_;         // [n_states]: some byte has a transition
  std::vector<int32_t> call_begin;        // [n_states + 1] CSR into calls
  std::vector<Call> calls;
  std::vector<int32_t> machine;        // [n_states] -> machine index
  std::vector<uint8_t> machine_calls;  // [n_machines]: some state of the machine has calls
  // [n_machines]: a call of the machine may return without consuming a byte (when unsure: 1).
  std::vector<uint8_t> machine_nullable;
  // [n_states]: the state is inside a repetition of at least kLongRepeatCopies copies, where states
  // far from the repetition's bounds may share token entries (bounded_future.h).
  std::vector<uint8_t> in_long_repeat;
  int32_t root_start = -1;

  int32_t next(int32_t state, uint8_t byte) const { return next_[size_t(state) * n_classes + byte_class[byte]]; }
  bool is_final(int32_t state) const { return final_[state]; }
  bool consumes(int32_t state) const { return consumes_[state]; }
  bool has_calls(int32_t state) const { return call_begin[state] != call_begin[state + 1]; }
  // Whether no state of state's machine calls (then matching from it is one DFA walk).
  bool call_free(int32_t state) const { return !machine_calls[machine[state]]; }
};

// Builds the automaton of a checked grammar (no left recursion, every rule productive).
// Errors: invalid_argument when the NFA or DFA would exceed limits.max_automaton_states or the
// expansion of repetitions limits.max_elements.
Result<GrammarAutomaton> build_grammar_automaton(const Grammar& g, const GrammarLimits& limits);

}  // namespace afd::serve
