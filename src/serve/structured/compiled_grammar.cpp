#include "serve/structured/compiled_grammar.h"

#include <algorithm>

namespace afd::serve {
namespace {

inline void set_bit(std::vector<uint64_t>* bits, int32_t t) { (*bits)[t >> 6] |= uint64_t{1} << (t & 63); }

}  // namespace

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(std::shared_ptr<const Grammar> grammar,
                                                                        std::shared_ptr<const TokenVocab> vocab) {
  if (!grammar || !vocab) return invalid_argument("CompiledGrammar::compile needs a grammar and a vocabulary");
  std::shared_ptr<CompiledGrammar> c(new CompiledGrammar());
  const size_t n = size_t(2) * grammar->automaton().n_states;
  c->entries_ = std::make_unique<std::atomic<const TokenEntry*>[]>(n);
  for (size_t i = 0; i < n; ++i) c->entries_[i].store(nullptr, std::memory_order_relaxed);
  c->grammar_ = std::move(grammar);
  c->vocab_ = std::move(vocab);
  return std::shared_ptr<const CompiledGrammar>(std::move(c));
}

const CompiledGrammar::TokenEntry& CompiledGrammar::token_entry(int32_t state, bool bottom) const {
  std::atomic<const TokenEntry*>& slot = entries_[size_t(2) * state + bottom];
  if (const TokenEntry* e = slot.load(std::memory_order_acquire)) return *e;
  std::unique_ptr<TokenEntry> built = build_entry(state, bottom);
  std::lock_guard<std::mutex> lock(mu_);
  if (const TokenEntry* e = slot.load(std::memory_order_acquire)) return *e;  // another thread won
  bytes_ += built->bytes();
  owned_.push_back(std::move(built));
  slot.store(owned_.back().get(), std::memory_order_release);
  return *owned_.back();
}

size_t CompiledGrammar::cached_bytes() const { return bytes_.load(); }

int64_t CompiledGrammar::n_cached_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(owned_.size());
}

std::unique_ptr<CompiledGrammar::TokenEntry> CompiledGrammar::build_entry(int32_t state, bool bottom) const {
  auto e = std::make_unique<TokenEntry>();
  std::vector<uint64_t> bits(static_cast<size_t>(vocab_->mask_words()), 0);
  const GrammarAutomaton& a = automaton();
  if (a.call_free(state)) {
    walk_dfa(state, bottom, &bits, &e->context_dependent);
  } else {
    StackSet init;
    if (expand_stack(a, GrammarStack{state}, &init) && normalize(&init)) {
      walk_stacks(init, bottom, &bits, &e->context_dependent, &e->max_depth);
    } else {
      e->max_depth = static_cast<int32_t>(kMaxStackDepth) + 1;  // every stack falls back to a full walk
    }
  }
  std::sort(e->context_dependent.begin(), e->context_dependent.end());
  int64_t n_accepted = 0;
  for (uint64_t w : bits) n_accepted += __builtin_popcountll(w);
  // A list costs 32 bits a token, the bitset one bit per vocabulary entry.
  if (n_accepted * 32 < vocab_->vocab_size()) {
    e->accepted_ids.reserve(static_cast<size_t>(n_accepted));
    for (size_t w = 0; w < bits.size(); ++w)
      for (uint64_t x = bits[w]; x; x &= x - 1)
        e->accepted_ids.push_back(static_cast<int32_t>(w * 64 + __builtin_ctzll(x)));
  } else {
    e->accepted_bits = std::move(bits);
  }
  return e;
}

void CompiledGrammar::walk_dfa(int32_t state, bool bottom, std::vector<uint64_t>* bits,
                               std::vector<int32_t>* cd) const {
  const GrammarAutomaton& a = automaton();
  const TokenVocab& v = *vocab_;
  const uint8_t* byte = v.node_byte().data();
  const int32_t* depth = v.node_depth().data();
  const int32_t* end = v.node_end().data();
  const int32_t* node_tokens = v.node_tokens().data();
  const int32_t* ids = v.token_ids().data();
  const int32_t n_nodes = v.n_nodes();
  // st[d]: state after d bytes; ended[d]: the frame could have finished within the first d bytes.
  std::vector<int32_t> st(static_cast<size_t>(v.max_depth()) + 1);
  std::vector<uint8_t> ended(st.size());
  st[0] = state;
  ended[0] = a.is_final(state);
  const int32_t n_classes = a.n_classes;
  const int32_t* next = a.next_.data();
  const uint8_t* fin = a.final_.data();
  for (int32_t i = 0; i < n_nodes;) {
    const int32_t d = depth[i];
    const int32_t s = next[size_t(st[d - 1]) * n_classes + a.byte_class[byte[i]]];
    if (s < 0) {
      // Dead here: the rest can only continue below this frame.
      if (!bottom && ended[d - 1])
        for (int32_t k = node_tokens[i]; k < node_tokens[end[i]]; ++k) cd->push_back(ids[k]);
      i = end[i];
      continue;
    }
    st[d] = s;
    ended[d] = ended[d - 1] | fin[s];
    for (int32_t k = node_tokens[i]; k < node_tokens[i + 1]; ++k) set_bit(bits, ids[k]);
    ++i;
  }
}

void CompiledGrammar::walk_stacks(const StackSet& init, bool bottom, std::vector<uint64_t>* bits,
                                  std::vector<int32_t>* cd, int32_t* max_depth) const {
  const GrammarAutomaton& a = automaton();
  const TokenVocab& v = *vocab_;
  const auto& byte = v.node_byte();
  const auto& depth = v.node_depth();
  const auto& end = v.node_end();
  const auto& node_tokens = v.node_tokens();
  const auto& ids = v.token_ids();
  std::vector<StackSet> sets(static_cast<size_t>(v.max_depth()) + 1);
  std::vector<uint8_t> ended(sets.size());
  sets[0] = init;
  ended[0] = init.ended;
  auto deepest = [&](const StackSet& s) {
    for (const GrammarStack& x : s.live) *max_depth = std::max(*max_depth, static_cast<int32_t>(x.size()));
  };
  deepest(init);
  auto all_cd = [&](int32_t from, int32_t to) {
    for (int32_t k = node_tokens[from]; k < node_tokens[to]; ++k) cd->push_back(ids[k]);
  };
  for (int32_t i = 0; i < v.n_nodes();) {
    const int32_t d = depth[i];
    StackSet& cur = sets[d];
    if (sets[d - 1].live.empty()) {
      // Only an earlier finish of this frame can continue (below it).
      if (!bottom && ended[d - 1]) all_cd(i, end[i]);
      i = end[i];
      continue;
    }
    if (!step_byte(a, sets[d - 1], byte[i], &cur)) {
      // Past a bound here; the real stack decides (a bottom stack is the real stack: refused).
      if (!bottom) all_cd(i, end[i]);
      i = end[i];
      continue;
    }
    deepest(cur);
    ended[d] = ended[d - 1] | cur.ended;
    if (cur.alive()) {
      for (int32_t k = node_tokens[i]; k < node_tokens[i + 1]; ++k) set_bit(bits, ids[k]);
    } else if (!bottom && ended[d - 1]) {
      all_cd(i, i + 1);
    }
    if (cur.live.empty()) {
      if (!bottom && ended[d]) all_cd(i + 1, end[i]);
      i = end[i];
      continue;
    }
    ++i;
  }
}

void CompiledGrammar::or_allowed_full(const GrammarStack& stack, uint64_t* mask) const {
  StackSet init;
  init.live.push_back(stack);
  std::vector<uint64_t> bits(static_cast<size_t>(vocab_->mask_words()), 0);
  std::vector<int32_t> cd;
  int32_t depth = 0;
  walk_stacks(init, true, &bits, &cd, &depth);
  for (size_t w = 0; w < bits.size(); ++w) mask[w] |= bits[w];
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
