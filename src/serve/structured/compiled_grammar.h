// CompiledGrammar: a Grammar bound to a TokenVocab, with what the per-step token mask needs
// precomputed per automaton state (a TokenEntry, token_entry.h) and cached. Entries are built
// lazily, on the first mask that needs them; a mask combines the entries of the frames of a stack
// (stack_mask.h).
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
#include "serve/structured/token_entry.h"
#include "serve/structured/token_vocab.h"

namespace afd::serve {

class CompiledGrammar {
 public:
  using TokenEntry = ::afd::serve::TokenEntry;

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

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  // [2 * n_states]: entry of (state, bottom) at 2 * state + bottom; null until built.
  mutable std::unique_ptr<std::atomic<const TokenEntry*>[]> entries_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<TokenEntry>> owned_;
  mutable std::atomic<size_t> bytes_{0};
};

}  // namespace afd::serve
