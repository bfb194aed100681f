#include "serve/structured/compiled_grammar.h"

#include <algorithm>

#include "serve/structured/bounded_future.h"

namespace afd::serve {
namespace {

// Sharing (bounded_future.h): how many states of one key a new state is compared with, and how
// many pairs of states one comparison may search (its work is pairs x byte classes).
constexpr size_t kMaxSharingCandidates = 2;
constexpr int32_t kMaxFuturePairs = 8192;

// What a grammar and its automaton hold, roughly.
size_t grammar_bytes(const Grammar& g) {
  const GrammarAutomaton& a = g.automaton();
  size_t n = a.next_.capacity() * 4 + a.final_.capacity() + a.consumes_.capacity() + a.call_begin.capacity() * 4 +
             a.calls.capacity() * sizeof(GrammarAutomaton::Call) + a.machine.capacity() * 4 +
             a.machine_calls.capacity();
  n += g.exprs().capacity() * sizeof(GrammarExpr) + g.rules().capacity() * sizeof(GrammarRule);
  for (const GrammarExpr& e : g.exprs()) n += e.children.capacity() * 4;
  for (const GrammarRule& r : g.rules()) n += r.name.capacity();
  return n;
}

}  // namespace

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(std::shared_ptr<const Grammar> grammar,
                                                                        std::shared_ptr<const TokenVocab> vocab,
                                                                        size_t max_entry_bytes) {
  if (!grammar || !vocab) return invalid_argument("CompiledGrammar::compile needs a grammar and a vocabulary");
  std::shared_ptr<CompiledGrammar> c(new CompiledGrammar());
  const size_t n = size_t(2) * grammar->automaton().n_states;
  c->entries_ = std::make_unique<std::atomic<const TokenEntry*>[]>(n);
  for (size_t i = 0; i < n; ++i) c->entries_[i].store(nullptr, std::memory_order_relaxed);
  c->fixed_bytes_ = sizeof(CompiledGrammar) + n * sizeof(void*) + grammar_bytes(*grammar);
  c->max_entry_bytes_ = max_entry_bytes;
  c->grammar_ = std::move(grammar);
  c->vocab_ = std::move(vocab);
  return std::shared_ptr<const CompiledGrammar>(std::move(c));
}

const CompiledGrammar::TokenEntry* CompiledGrammar::token_entry(int32_t state, bool bottom,
                                                                std::unique_ptr<TokenEntry>* hold) const {
  std::atomic<const TokenEntry*>& slot = entries_[size_t(2) * state + bottom];
  if (const TokenEntry* e = slot.load(std::memory_order_acquire)) return e;
  std::atomic<const TokenEntry*>& above = entries_[size_t(2) * state];  // the non-bottom entry serves both
  if (const TokenEntry* e = above.load(std::memory_order_acquire)) return e;
  // A cached entry of a state with the same bounded future serves this state too.
  const GrammarAutomaton& a = automaton();
  const int32_t depth = vocab_->max_depth();
  const bool keyed = a.in_long_repeat[state];
  const uint64_t key = keyed ? bounded_future_key(a, state, depth) * 2 + bottom : 0;
  if (keyed) {
    std::vector<int32_t> reps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = by_future_.find(key); it != by_future_.end()) reps = it->second;
    }
    for (int32_t rep : reps) {
      if (!same_bounded_future(a, state, rep, depth, kMaxFuturePairs)) continue;
      const TokenEntry* e = entries_[size_t(2) * rep + bottom].load(std::memory_order_acquire);
      std::lock_guard<std::mutex> lock(mu_);
      if (const TokenEntry* won = slot.load(std::memory_order_acquire)) return won;
      slot.store(e, std::memory_order_release);
      if (!bottom) {
        std::atomic<const TokenEntry*>& below = entries_[size_t(2) * state + 1];
        if (!below.load(std::memory_order_relaxed)) below.store(e, std::memory_order_release);
      }
      n_shared_.fetch_add(1, std::memory_order_relaxed);
      return e;
    }
  }
  std::unique_ptr<TokenEntry> built = build_token_entry(automaton(), *vocab_, state, bottom);
  std::lock_guard<std::mutex> lock(mu_);
  if (const TokenEntry* e = slot.load(std::memory_order_acquire)) return e;  // another thread won
  const size_t size = built->bytes();
  if (bytes_.load(std::memory_order_relaxed) + size > max_entry_bytes_) {
    n_uncached_.fetch_add(1, std::memory_order_relaxed);
    *hold = std::move(built);
    return hold->get();
  }
  bytes_ += size;
  owned_.push_back(std::move(built));
  slot.store(owned_.back().get(), std::memory_order_release);
  if (keyed) {
    std::vector<int32_t>& reps = by_future_[key];
    if (reps.size() < kMaxSharingCandidates) reps.push_back(state);
  }
  if (!bottom) {
    std::atomic<const TokenEntry*>& below = entries_[size_t(2) * state + 1];
    if (!below.load(std::memory_order_relaxed)) below.store(owned_.back().get(), std::memory_order_release);
  }
  return owned_.back().get();
}

size_t CompiledGrammar::cached_bytes() const { return bytes_.load(); }

int64_t CompiledGrammar::n_cached_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(owned_.size());
}

void CompiledGrammar::or_allowed_full(const GrammarStack& stack, uint64_t* mask) const {
  or_consumed_by_stack(automaton(), *vocab_, stack, mask);
}

bool CompiledGrammar::stack_accepts(const GrammarStack& stack, std::string_view bytes) const {
  StackSet cur, next;
  cur.live.push_back(stack);
  for (char c : bytes) {
    if (cur.live.empty()) return false;
    if (!step_byte(automaton(), cur, static_cast<uint8_t>(c), &next)) return false;
    std::swap(cur, next);
  }
  return cur.alive();
}

}  // namespace afd::serve
