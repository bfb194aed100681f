// CompiledGrammar: a Grammar bound to a TokenVocab, with what the per-step token mask needs
// precomputed per automaton state and cached.
//
// For a stack whose top is state s, a token is classified once, whatever lies below s:
// accepted (its bytes are consumed by s's machine and what it calls, so the token is allowed on
// every stack with top s), rejected, or context-dependent (its bytes only fit by finishing s's
// machine and continuing in the frames below — checked per step against the real stack). A stack
// of one frame has nothing below (bottom entries), so it has no context-dependent tokens. Entries
// are built lazily, on the first mask that needs them.
//
// Threading: immutable but for the entry cache, which is filled under a lock and read without one;
// shared by any number of matchers on any threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"
#include "serve/structured/grammar.h"
#include "serve/structured/grammar_automaton.h"
#include "serve/structured/stack_set.h"
#include "serve/structured/token_vocab.h"

namespace afd::serve {

class CompiledGrammar {
 public:
  struct TokenEntry {
    std::vector<int32_t> accepted_ids;       // sorted; used when accepted_bits is empty
    std::vector<uint64_t> accepted_bits;     // [mask words] when many tokens are accepted
    std::vector<int32_t> context_dependent;  // sorted
    int32_t max_depth = 1;                   // deepest stack (from this frame up) any match reached
    size_t bytes() const {
      return accepted_ids.capacity() * 4 + accepted_bits.capacity() * 8 + context_dependent.capacity() * 4;
    }
  };

  static Result<std::shared_ptr<const CompiledGrammar>> compile(std::shared_ptr<const Grammar> grammar,
                                                                std::shared_ptr<const TokenVocab> vocab);

  const Grammar& grammar() const { return *grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }
  const GrammarAutomaton& automaton() const { return grammar_->automaton(); }
  // The entry of a stack with top `state`; bottom: the stack has only that frame.
  const TokenEntry& token_entry(int32_t state, bool bottom) const;
  // Bit t of mask set for every token t whose bytes the single stack `stack` consumes (a walk of
  // the whole trie; for stacks too deep for the cached entries).
  void or_allowed_full(const GrammarStack& stack, uint64_t* mask) const;
  // Whether the stack consumes all of the token's bytes (and survives).
  bool stack_accepts(const GrammarStack& stack, std::string_view bytes) const;
  // Bytes held by the entries built so far.
  size_t cached_bytes() const;
  int64_t n_cached_entries() const;

 private:
  CompiledGrammar() = default;
  std::unique_ptr<TokenEntry> build_entry(int32_t state, bool bottom) const;
  // Walks the trie from `init` (a local stack set when !bottom); fills accepted bits, the
  // context-dependent tokens and the deepest stack seen.
  void walk_stacks(const StackSet& init, bool bottom, std::vector<uint64_t>* bits, std::vector<int32_t>* cd,
                   int32_t* max_depth) const;
  void walk_dfa(int32_t state, bool bottom, std::vector<uint64_t>* bits, std::vector<int32_t>* cd) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  // [2 * n_states]: entry of (state, bottom) at 2 * state + bottom; null until built.
  mutable std::unique_ptr<std::atomic<const TokenEntry*>[]> entries_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<TokenEntry>> owned_;
  mutable std::atomic<size_t> bytes_{0};
};

}  // namespace afd::serve
