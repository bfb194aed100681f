#include "serve/structured/grammar_cache.h"

#include <chrono>
#include <utility>

#include "serve/structured/gbnf.h"

namespace afd::serve {

namespace {

// The grammar of a slot whose compilation has finished and succeeded, or null.
const CompiledGrammar* ready(const std::shared_future<Result<std::shared_ptr<const CompiledGrammar>>>& f) {
  if (!f.valid() || f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return nullptr;
  const auto& v = f.get();
  return v.ok() ? v->get() : nullptr;
}

}  // namespace

GrammarCache::GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t capacity, GrammarLimits limits,
                           size_t max_bytes, size_t max_entry_bytes)
    : vocab_(std::move(vocab)),
      capacity_(capacity == 0 ? 1 : capacity),
      limits_(limits),
      max_bytes_(max_bytes),
      max_entry_bytes_(max_entry_bytes) {}

void GrammarCache::evict_over_budget(const std::string& keep) {
  size_t total = 0;
  for (const auto& [text, slot] : slots_)
    if (const CompiledGrammar* g = ready(slot.value)) total += g->memory_bytes() + text.size();
  // Oldest first; a grammar still compiling is skipped (it is counted once ready).
  for (auto it = lru_.end(); total > max_bytes_ && it != lru_.begin();) {
    --it;
    if (*it == keep) continue;
    auto slot = slots_.find(*it);
    const CompiledGrammar* g = ready(slot->second.value);
    if (!g) continue;
    total -= g->memory_bytes() + it->size();
    slots_.erase(slot);
    it = lru_.erase(it);
  }
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::get(std::string_view gbnf) {
  std::promise<Value> promise;
  std::shared_future<Value> future;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(std::string(gbnf));
    if (it != slots_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      future = it->second.value;
      evict_over_budget(it->first);
    } else {
      owner = true;
      future = promise.get_future().share();
      lru_.push_front(std::string(gbnf));
      slots_.emplace(lru_.front(), Slot{future, lru_.begin()});
      while (slots_.size() > capacity_) {  // waiters of an evicted slot keep their future
        slots_.erase(lru_.back());
        lru_.pop_back();
      }
      ++n_compiled_;
    }
  }
  if (!owner) return future.get();  // waits outside the lock while the owner compiles
  Value value = [&]() -> Value {
    AFD_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, parse_gbnf(gbnf, limits_));
    return CompiledGrammar::compile(std::move(g), vocab_, max_entry_bytes_);
  }();
  promise.set_value(value);
  if (value.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    evict_over_budget(std::string(gbnf));
  }
  if (!value.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(std::string(gbnf));
    if (it != slots_.end() && it->second.value.valid() &&
        it->second.value.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
        !it->second.value.get().ok()) {
      lru_.erase(it->second.lru);
      slots_.erase(it);
    }
  }
  return value;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

size_t GrammarCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const auto& [text, slot] : slots_)
    if (const CompiledGrammar* g = ready(slot.value)) total += g->memory_bytes() + text.size();
  return total;
}

int64_t GrammarCache::n_compiled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_compiled_;
}

}  // namespace afd::serve
