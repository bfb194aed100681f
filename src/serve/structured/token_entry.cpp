#include "serve/structured/token_entry.h"

#include <algorithm>
#include <string_view>

namespace afd::serve {
namespace {

// What one walk of the trie collects. Depth d counts bytes from the frame's start; popped(d): the
// frame can end right after the first d bytes of the current trie path.
class EntryBuilder {
 public:
  EntryBuilder(const TokenVocab& v, bool bottom)
      : v_(v),
        bottom_(bottom),
        bits_(static_cast<size_t>(v.mask_words()), 0),
        popped_(static_cast<size_t>(v.max_depth()) + 1, 0),
        n_popped_(popped_.size(), 0) {}

  void set_popped(int32_t d, bool p) {
    popped_[d] = p;
    n_popped_[d] = d == 0 ? 0 : n_popped_[d - 1] + p;
  }
  // The tokens ending at trie node i are consumed.
  void accept_node(int32_t i) {
    const int32_t* ids = v_.token_ids().data();
    for (int32_t k = v_.node_tokens()[i]; k < v_.node_tokens()[i + 1]; ++k)
      bits_[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
  }
  // The tokens of trie nodes [from, to) share the current path's first d_max bytes and die after
  // them: each may continue below the frame where it popped within those bytes.
  void dead(int32_t from, int32_t to, int32_t d_max) {
    if (bottom_ || n_popped_[d_max] == 0) return;
    const int32_t* ids = v_.token_ids().data();
    for (int32_t e = 1; e <= d_max; ++e) {
      if (!popped_[e]) continue;
      for (int32_t k = v_.node_tokens()[from]; k < v_.node_tokens()[to]; ++k) {
        const int32_t t = ids[k];
        splits_.push_back({t, v_.find(v_.bytes(t).substr(static_cast<size_t>(e))), e});
      }
    }
  }
  // The tokens of trie nodes [from, to) are decided on the real stack.
  void check_subtree(int32_t from, int32_t to) {
    if (bottom_) return;
    const int32_t* ids = v_.token_ids().data();
    for (int32_t k = v_.node_tokens()[from]; k < v_.node_tokens()[to]; ++k) check_.push_back(ids[k]);
  }
  std::vector<uint64_t>& bits() { return bits_; }

  std::unique_ptr<TokenEntry> finish(int32_t max_depth) {
    auto e = std::make_unique<TokenEntry>();
    e->pops_at_start = !bottom_ && popped_[0];
    e->max_depth = max_depth;
    auto first = [&](const TokenEntry::Split& x) { return static_cast<uint8_t>(v_.bytes(x.token)[x.at]); };
    std::sort(splits_.begin(), splits_.end(), [&](const TokenEntry::Split& x, const TokenEntry::Split& y) {
      if (first(x) != first(y)) return first(x) < first(y);
      return x.suffix != y.suffix ? x.suffix < y.suffix : x.token != y.token ? x.token < y.token : x.at < y.at;
    });
    for (size_t i = 0; i < splits_.size(); ++i)
      if (i == 0 || first(splits_[i]) != first(splits_[i - 1])) e->split_groups.push_back(static_cast<int32_t>(i));
    e->split_groups.push_back(static_cast<int32_t>(splits_.size()));
    e->split_by_token.resize(splits_.size());
    for (size_t i = 0; i < splits_.size(); ++i) e->split_by_token[i] = static_cast<int32_t>(i);
    std::sort(e->split_by_token.begin(), e->split_by_token.end(), [&](int32_t x, int32_t y) {
      return splits_[x].token != splits_[y].token ? splits_[x].token < splits_[y].token : splits_[x].at < splits_[y].at;
    });
    e->splits = std::move(splits_);
    std::sort(check_.begin(), check_.end());
    e->check_on_stack = std::move(check_);
    int64_t n_accepted = 0;
    for (uint64_t w : bits_) n_accepted += __builtin_popcountll(w);
    // A list costs 32 bits a token, the bitset one bit per vocabulary entry.
    if (n_accepted * 32 < v_.vocab_size()) {
      e->accepted_ids.reserve(static_cast<size_t>(n_accepted));
      for (size_t w = 0; w < bits_.size(); ++w)
        for (uint64_t x = bits_[w]; x; x &= x - 1)
          e->accepted_ids.push_back(static_cast<int32_t>(w * 64 + __builtin_ctzll(x)));
    } else {
      e->accepted_bits = std::move(bits_);
    }
    return e;
  }

 private:
  const TokenVocab& v_;
  const bool bottom_;
  std::vector<uint64_t> bits_;
  std::vector<uint8_t> popped_;
  std::vector<int32_t> n_popped_;  // [d]: how many of popped(1..d) hold
  std::vector<TokenEntry::Split> splits_;
  std::vector<int32_t> check_;
};

// A state whose machine calls nothing: one DFA walk.
void walk_dfa(const GrammarAutomaton& a, const TokenVocab& v, int32_t state, EntryBuilder* b) {
  const uint8_t* byte = v.node_byte().data();
  const int32_t* depth = v.node_depth().data();
  const int32_t* end = v.node_end().data();
  const int32_t n_nodes = v.n_nodes();
  std::vector<int32_t> st(static_cast<size_t>(v.max_depth()) + 1);  // [d]: state after d bytes
  st[0] = state;
  b->set_popped(0, a.is_final(state));
  const int32_t n_classes = a.n_classes;
  const int32_t* next = a.next_.data();
  for (int32_t i = 0; i < n_nodes;) {
    const int32_t d = depth[i];
    const int32_t s = next[size_t(st[d - 1]) * n_classes + a.byte_class[byte[i]]];
    if (s < 0) {
      b->dead(i, end[i], d - 1);
      i = end[i];
      continue;
    }
    st[d] = s;
    b->set_popped(d, a.is_final(s));
    b->accept_node(i);
    ++i;
  }
}

// A stack set from `init` (expanded): every stack it reaches, per byte. Returns the deepest stack.
int32_t walk_stacks(const GrammarAutomaton& a, const TokenVocab& v, const StackSet& init, EntryBuilder* b) {
  const auto& byte = v.node_byte();
  const auto& depth = v.node_depth();
  const auto& end = v.node_end();
  std::vector<StackSet> sets(static_cast<size_t>(v.max_depth()) + 1);
  sets[0] = init;
  b->set_popped(0, init.ended);
  int32_t max_depth = 1;
  auto deepest = [&](const StackSet& s) {
    for (const GrammarStack& x : s.live) max_depth = std::max(max_depth, static_cast<int32_t>(x.size()));
  };
  deepest(init);
  for (int32_t i = 0; i < v.n_nodes();) {
    const int32_t d = depth[i];
    StackSet& cur = sets[d];
    if (!step_byte(a, sets[d - 1], byte[i], &cur)) {
      b->check_subtree(i, end[i]);  // past a bound here: the real stack decides
      i = end[i];
      continue;
    }
    if (!cur.alive()) {
      b->dead(i, end[i], d - 1);
      i = end[i];
      continue;
    }
    deepest(cur);
    b->set_popped(d, cur.ended);
    b->accept_node(i);
    if (cur.live.empty()) {
      b->dead(i + 1, end[i], d);
      i = end[i];
      continue;
    }
    ++i;
  }
  return max_depth;
}

}  // namespace

bool TokenEntry::accepts(int32_t token) const {
  if (!accepted_bits.empty()) return (accepted_bits[token >> 6] >> (token & 63)) & 1;
  return std::binary_search(accepted_ids.begin(), accepted_ids.end(), token);
}

std::pair<const int32_t*, const int32_t*> TokenEntry::splits_of(int32_t token) const {
  const int32_t* first = split_by_token.data();
  const int32_t* last = first + split_by_token.size();
  const int32_t* lo =
      std::lower_bound(first, last, token, [&](int32_t i, int32_t t) { return splits[i].token < t; });
  const int32_t* hi = lo;
  while (hi != last && splits[*hi].token == token) ++hi;
  return {lo, hi};
}

bool TokenEntry::check_on_stack_has(int32_t token) const {
  return std::binary_search(check_on_stack.begin(), check_on_stack.end(), token);
}

size_t TokenEntry::bytes() const {
  return sizeof(TokenEntry) + accepted_ids.capacity() * 4 + accepted_bits.capacity() * 8 +
         splits.capacity() * sizeof(Split) + split_by_token.capacity() * 4 + check_on_stack.capacity() * 4;
}

std::unique_ptr<TokenEntry> build_token_entry(const GrammarAutomaton& a, const TokenVocab& v, int32_t state,
                                              bool bottom) {
  EntryBuilder b(v, bottom);
  if (a.call_free(state)) {
    walk_dfa(a, v, state, &b);
    return b.finish(1);
  }
  StackSet init;
  if (!expand_stack(a, GrammarStack{state}, &init) || !normalize(&init)) {
    // Every stack with this top falls back to a simulation of the real stack.
    return b.finish(static_cast<int32_t>(kMaxStackDepth) + 1);
  }
  const int32_t max_depth = walk_stacks(a, v, init, &b);
  return b.finish(max_depth);
}

void or_consumed_by_stack(const GrammarAutomaton& a, const TokenVocab& v, const GrammarStack& stack, uint64_t* mask) {
  EntryBuilder b(v, /*bottom=*/true);
  StackSet init;
  init.live.push_back(stack);
  walk_stacks(a, v, init, &b);
  const std::vector<uint64_t>& bits = b.bits();
  for (size_t w = 0; w < bits.size(); ++w) mask[w] |= bits[w];
}

}  // namespace afd::serve
