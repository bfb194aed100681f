// GrammarCache: compiled grammars by their GBNF text, least recently used dropped past `capacity`
// grammars or past `max_bytes`. Concurrent get()s of one text compile it once (the others wait for
// that compilation). Errors are returned to every waiter of that compilation and not kept: the next
// get() of the text tries again. Threading: all methods thread-safe.
//
// Memory: a grammar's bytes (CompiledGrammar::memory_bytes(): automaton plus the token entries it
// has cached, which grow as masks visit new states) count against max_bytes. Each get() re-counts
// and drops least recently used grammars until the total fits, never the one it returns; a dropped
// grammar lives on while matchers hold it. Each grammar's own entry cache is bounded by
// max_entry_bytes (compiled_grammar.h), so one grammar never holds more than its automaton plus that.
#pragma once

#include <cstddef>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/status.h"
#include "serve/structured/compiled_grammar.h"
#include "serve/structured/grammar.h"
#include "serve/structured/token_vocab.h"

namespace afd::serve {

class GrammarCache {
 public:
  static constexpr size_t kDefaultMaxBytes = size_t{1} << 30;

  GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t capacity = 256, GrammarLimits limits = {},
               size_t max_bytes = kDefaultMaxBytes, size_t max_entry_bytes = CompiledGrammar::kDefaultMaxEntryBytes);
  // The compiled grammar of the text; errors as parse_gbnf().
  Result<std::shared_ptr<const CompiledGrammar>> get(std::string_view gbnf);
  const std::shared_ptr<const TokenVocab>& vocab() const { return vocab_; }
  size_t size() const;
  // The memory_bytes() of the grammars held now.
  size_t bytes() const;
  // Compilations run so far (a get() served from the cache or by waiting runs none).
  int64_t n_compiled() const;

 private:
  using Value = Result<std::shared_ptr<const CompiledGrammar>>;
  struct Slot {
    std::shared_future<Value> value;
    std::list<std::string>::iterator lru;  // position in lru_
  };

  const std::shared_ptr<const TokenVocab> vocab_;
  // Drops least recently used ready grammars, not `keep`, while over max_bytes_. Under mu_.
  void evict_over_budget(const std::string& keep);

  const size_t capacity_;
  const GrammarLimits limits_;
  const size_t max_bytes_, max_entry_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> slots_;
  std::list<std::string> lru_;  // most recently used first
  int64_t n_compiled_ = 0;
};

}  // namespace afd::serve
