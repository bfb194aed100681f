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
  // The tokens of trie nodes [from, to) (a subtree, or the children of one node) share the current
  // path's first d_max bytes and die after them: each may continue below the frame where it popped
  // within those bytes.
  void dead(int32_t from, int32_t to, int32_t d_max) {
    if (bottom_ || n_popped_[d_max] == 0 || from == to) return;
    const std::string_view b = v_.bytes(v_.token_ids()[v_.node_tokens()[from]]);  // a token of the range
    for (int32_t e = 1; e <= d_max; ++e)
      if (popped_[e]) splits_.push_back({from, to, e, static_cast<uint8_t>(b[static_cast<size_t>(e)])});
  }
  // The same for the subtrees of the children of node i (at depth d), whose rests can start with
  // different bytes when the frame popped right after node i.
  void dead_children(int32_t i, int32_t d) {
    if (bottom_ || n_popped_[d] == 0) return;
    const int32_t* end = v_.node_end().data();
    for (int32_t c = i + 1; c < end[i]; c = end[c]) dead(c, end[c], d);
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
    // By the first byte of the rest (stable: trie order within a byte).
    auto first = [](const TokenEntry::SplitRange& x) { return x.first; };
    std::stable_sort(
        splits_.begin(), splits_.end(),
        [&](const TokenEntry::SplitRange& x, const TokenEntry::SplitRange& y) { return first(x) < first(y); });
    for (size_t i = 0; i < splits_.size(); ++i)
      if (i == 0 || first(splits_[i]) != first(splits_[i - 1])) e->split_groups.push_back(static_cast<int32_t>(i));
    e->split_groups.push_back(static_cast<int32_t>(splits_.size()));
    e->splits = std::move(splits_);
    e->split_by_node.resize(e->splits.size());
    for (size_t i = 0; i < e->splits.size(); ++i) e->split_by_node[i] = static_cast<int32_t>(i);
    std::sort(e->split_by_node.begin(), e->split_by_node.end(), [&](int32_t x, int32_t y) {
      const TokenEntry::SplitRange &rx = e->splits[x], &ry = e->splits[y];
      return rx.from != ry.from ? rx.from < ry.from : rx.at < ry.at;
    });
    e->bottom = bottom_;
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
  std::vector<TokenEntry::SplitRange> splits_;
  std::vector<int32_t> check_;
};

// A state whose machine calls nothing: one DFA walk. kBottom: no splits to record, so only the
// accepted tokens are kept track of.
template <bool kBottom>
void walk_dfa(const GrammarAutomaton& a, const TokenVocab& v, int32_t state, EntryBuilder* b) {
  const uint8_t* byte = v.node_byte().data();
  const int32_t* depth = v.node_depth().data();
  const int32_t* end = v.node_end().data();
  const int32_t* node_tokens = v.node_tokens().data();
  const int32_t* ids = v.token_ids().data();
  const uint8_t* cls = a.byte_class.data();
  const int32_t* next = a.next_.data();
  const uint8_t* fin = a.final_.data();
  const int32_t n_nodes = v.n_nodes();
  const size_t n_classes = static_cast<size_t>(a.n_classes);
  uint64_t* bits = b->bits().data();
  std::vector<const int32_t*> row(static_cast<size_t>(v.max_depth()) + 1);  // [d]: next row after d bytes
  row[0] = next + size_t(state) * n_classes;
  if (!kBottom) b->set_popped(0, fin[state]);
  for (int32_t i = 0; i < n_nodes;) {
    const int32_t d = depth[i];
    const int32_t s = row[d - 1][cls[byte[i]]];
    if (s < 0) {
      if (!kBottom) b->dead(i, end[i], d - 1);
      i = end[i];
      continue;
    }
    row[d] = next + size_t(s) * n_classes;
    if (!kBottom) b->set_popped(d, fin[s]);
    for (int32_t k = node_tokens[i], k_end = node_tokens[i + 1]; k < k_end; ++k)
      bits[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
    ++i;
  }
}

// A stack set from `init` (expanded): every stack it reaches, per byte. Returns the deepest stack.
// While the set is one frame whose state calls nothing (a string's or a number's inside of a
// recursive rule), a byte is one DFA transition; only calls and pops step whole stack sets.
int32_t walk_stacks(const GrammarAutomaton& a, const TokenVocab& v, const StackSet& init, EntryBuilder* b) {
  const uint8_t* byte = v.node_byte().data();
  const int32_t* depth = v.node_depth().data();
  const int32_t* end = v.node_end().data();
  const size_t n_depths = static_cast<size_t>(v.max_depth()) + 1;
  constexpr int32_t kSet = -1, kNone = -2;
  // [d]: the set after d bytes is the one frame single[d] (kNone: no frame) plus ended[d], or
  // (kSet) sets[d].
  std::vector<int32_t> single(n_depths, kSet);
  std::vector<uint8_t> ended(n_depths, 0);
  std::vector<StackSet> sets(n_depths);
  auto simplify = [&](size_t d) {
    const StackSet& s = sets[d];
    ended[d] = s.ended;
    if (s.live.empty()) {
      single[d] = kNone;
    } else if (s.live.size() == 1 && s.live[0].size() == 1 && !a.has_calls(s.live[0][0])) {
      single[d] = s.live[0][0];
    } else {
      single[d] = kSet;
    }
  };
  sets[0] = init;
  simplify(0);
  b->set_popped(0, init.ended);
  int32_t max_depth = 1;
  auto deepest = [&](const StackSet& s) {
    for (const GrammarStack& x : s.live) max_depth = std::max(max_depth, static_cast<int32_t>(x.size()));
  };
  deepest(init);
  const int32_t* node_tokens = v.node_tokens().data();
  const int32_t* ids = v.token_ids().data();
  const int32_t* call_begin = a.call_begin.data();
  const uint8_t* fin = a.final_.data();
  const uint8_t* consumes = a.consumes_.data();
  uint64_t* bits = b->bits().data();
  for (int32_t i = 0; i < v.n_nodes();) {
    const int32_t d = depth[i];
    const int32_t prev = single[d - 1];
    if (prev >= 0) {
      const int32_t n = a.next(prev, byte[i]);
      if (n >= 0 && call_begin[n] == call_begin[n + 1] && consumes[n]) {  // the common case
        single[d] = n;
        ended[d] = fin[n];
        b->set_popped(d, fin[n]);
        for (int32_t k = node_tokens[i], k_end = node_tokens[i + 1]; k < k_end; ++k)
          bits[ids[k] >> 6] |= uint64_t{1} << (ids[k] & 63);
        ++i;
        continue;
      }
      if (n < 0) {
        single[d] = kNone;
        ended[d] = 0;
      } else if (!a.has_calls(n)) {
        single[d] = a.consumes(n) ? n : kNone;
        ended[d] = a.is_final(n);
      } else {
        StackSet& cur = sets[d];
        cur.live.clear();
        cur.ended = false;
        if (!expand_stack(a, GrammarStack{n}, &cur) || !normalize(&cur)) {
          b->check_subtree(i, end[i]);  // past a bound here: the real stack decides
          i = end[i];
          continue;
        }
        deepest(cur);
        simplify(d);
      }
    } else {
      StackSet& cur = sets[d];
      if (!step_byte(a, sets[d - 1], byte[i], &cur)) {
        b->check_subtree(i, end[i]);
        i = end[i];
        continue;
      }
      deepest(cur);
      simplify(d);
    }
    if (single[d] == kNone && !ended[d]) {  // dead
      b->dead(i, end[i], d - 1);
      i = end[i];
      continue;
    }
    b->set_popped(d, ended[d]);
    b->accept_node(i);
    if (single[d] == kNone) {
      b->dead_children(i, d);
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

int32_t TokenEntry::splits_of(const TokenVocab& v, int32_t token, int32_t* at, int32_t max_at) const {
  if (split_by_node.empty()) return 0;
  const int32_t node = v.token_node(token);
  // Ranges are disjoint or equal: the last one starting at or before the node is the only candidate.
  auto it = std::upper_bound(split_by_node.begin(), split_by_node.end(), node,
                             [&](int32_t n, int32_t i) { return n < splits[i].from; });
  if (it == split_by_node.begin()) return 0;
  const TokenEntry::SplitRange& r = splits[*(it - 1)];
  if (node >= r.to) return 0;
  auto lo = it - 1;
  while (lo != split_by_node.begin() && splits[*(lo - 1)].from == r.from) --lo;
  int32_t n = 0;
  for (; lo != it && n < max_at; ++lo) at[n++] = splits[*lo].at;
  return n;
}

bool TokenEntry::check_on_stack_has(int32_t token) const {
  return std::binary_search(check_on_stack.begin(), check_on_stack.end(), token);
}

size_t TokenEntry::bytes() const {
  return sizeof(TokenEntry) + accepted_ids.capacity() * 4 + accepted_bits.capacity() * 8 +
         splits.capacity() * sizeof(SplitRange) + split_groups.capacity() * 4 + split_by_node.capacity() * 4 +
         check_on_stack.capacity() * 4;
}

std::unique_ptr<TokenEntry> build_token_entry(const GrammarAutomaton& a, const TokenVocab& v, int32_t state,
                                              bool bottom) {
  EntryBuilder b(v, bottom);
  if (a.call_free(state)) {
    if (bottom) {
      walk_dfa<true>(a, v, state, &b);
    } else {
      walk_dfa<false>(a, v, state, &b);
    }
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
