// GrammarCache: compiled grammars by their GBNF text, least recently used dropped past `capacity`.
// Concurrent get()s of one text compile it once (the others wait for that compilation). Errors
// are returned to every waiter of that compilation and not kept: the next get() of the text tries
// again. Threading: all methods thread-safe.
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
  GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t capacity = 256, GrammarLimits limits = {});
  // The compiled grammar of the text; errors as parse_gbnf().
  Result<std::shared_ptr<const CompiledGrammar>> get(std::string_view gbnf);
  const std::shared_ptr<const TokenVocab>& vocab() const { return vocab_; }
  size_t size() const;
  // Compilations run so far (a get() served from the cache or by waiting runs none).
  int64_t n_compiled() const;

 private:
  using Value = Result<std::shared_ptr<const CompiledGrammar>>;
  struct Slot {
    std::shared_future<Value> value;
    std::list<std::string>::iterator lru;  // position in lru_
  };

  const std::shared_ptr<const TokenVocab> vocab_;
  const size_t capacity_;
  const GrammarLimits limits_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> slots_;
  std::list<std::string> lru_;  // most recently used first
  int64_t n_compiled_ = 0;
};

}  // namespace afd::serve
