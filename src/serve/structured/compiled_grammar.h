// CompiledGrammar: a Grammar bound to a TokenVocab, with what the per-step token mask needs
// precomputed per automaton state (a TokenEntry, token_entry.h) and cached. Entries are built
// lazily, on the first mask that needs them; a mask combines the entries of the frames of a stack
// (stack_mask.h).
//
// Memory: cached entries are bounded by max_entry_bytes. Past it, an entry that is not cached yet
// is built for the one mask that needs it and dropped after (masks of such states cost a trie walk
// each, about a millisecond on a 150k vocabulary, but memory stays bounded); cached entries are
// never dropped, so a reference to one stays valid as long as the grammar.
//
// Sharing: states inside long repetitions whose futures agree within the longest token's length
// (bounded_future.h) share one entry: the first such state's entry is cached, and a later state
// with the same key and a future checked equal points to it.
//
// Threading: immutable but for the entry cache, which is filled under a lock and read without one;
// shared by any number of matchers on any threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
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

  static constexpr size_t kDefaultMaxEntryBytes = size_t{64} << 20;

  static Result<std::shared_ptr<const CompiledGrammar>> compile(std::shared_ptr<const Grammar> grammar,
                                                                std::shared_ptr<const TokenVocab> vocab,
                                                                size_t max_entry_bytes = kDefaultMaxEntryBytes);

  const Grammar& grammar() const { return *grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }
  const GrammarAutomaton& automaton() const { return grammar_->automaton(); }
  // The entry of a stack with top `state`; bottom: the stack has only that frame. The cached entry,
  // or, past the entry budget, one built into *hold (valid while *hold is).
  const TokenEntry* token_entry(int32_t state, bool bottom, std::unique_ptr<TokenEntry>* hold) const;
  // Bit t of mask set for every token t whose bytes the single stack `stack` consumes (a walk of
  // the whole trie; for stacks too deep for the cached entries).
  void or_allowed_full(const GrammarStack& stack, uint64_t* mask) const;
  // Whether the stack consumes all of the token's bytes (and survives).
  bool stack_accepts(const GrammarStack& stack, std::string_view bytes) const;
  // Bytes held by the entries cached so far.
  size_t cached_bytes() const;
  int64_t n_cached_entries() const;
  // Entries built and not cached (the budget was spent).
  int64_t n_uncached_builds() const { return n_uncached_.load(std::memory_order_relaxed); }
  // Entries found equal to a cached one by their bounded future, and shared instead of built.
  int64_t n_shared_entries() const { return n_shared_.load(std::memory_order_relaxed); }
  // What the grammar holds: automaton, grammar, entry cache (approximate, bytes).
  size_t memory_bytes() const { return fixed_bytes_ + cached_bytes(); }

 private:
  CompiledGrammar() = default;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  // [2 * n_states]: entry of (state, bottom) at 2 * state + bottom; null until built.
  mutable std::unique_ptr<std::atomic<const TokenEntry*>[]> entries_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<TokenEntry>> owned_;
  mutable std::atomic<size_t> bytes_{0};
  mutable std::atomic<int64_t> n_uncached_{0};
  mutable std::atomic<int64_t> n_shared_{0};
  // bounded_future_key() * 2 + bottom -> states whose entry for that bottom is cached.
  mutable std::unordered_map<uint64_t, std::vector<int32_t>> by_future_;
  size_t max_entry_bytes_ = kDefaultMaxEntryBytes;
  size_t fixed_bytes_ = 0;
};

}  // namespace afd::serve
