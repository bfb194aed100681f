#include "serve/structured/stack_mask.h"

#include <memory>
#include <string_view>
#include <vector>

namespace afd::serve {
namespace {

inline bool bit(const uint64_t* mask, int32_t t) { return (mask[t >> 6] >> (t & 63)) & 1; }
inline void set(uint64_t* mask, int32_t t) { mask[t >> 6] |= uint64_t{1} << (t & 63); }

// (level, token, where its rest starts) -> answer, open addressing; allocated on first use.
class Memo {
 public:
  // Whether a key fits: level < kMaxStackDepth, at < 2^16, token < 2^32.
  static bool fits(int32_t at) { return at >= 0 && at < (1 << 16); }
  // The answer's slot; *found: whether it was there.
  uint8_t* find_or_add(int32_t j, int32_t token, int32_t at, bool* found) {
    if (keys_.empty() || 2 * (n_ + 1) > keys_.size()) grow();
    const uint64_t key = (uint64_t(uint32_t(j) + 1) << 48) | (uint64_t(uint32_t(at)) << 32) | uint32_t(token);
    size_t i = hash(key) & (keys_.size() - 1);
    while (keys_[i] != 0 && keys_[i] != key) i = (i + 1) & (keys_.size() - 1);
    *found = keys_[i] == key;
    if (!*found) keys_[i] = key, ++n_;
    return &values_[i];
  }

 private:
  static size_t hash(uint64_t k) { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20); }
  void grow() {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<uint8_t> old_values = std::move(values_);
    const size_t cap = old_keys.empty() ? 256 : old_keys.size() * 2;
    keys_.assign(cap, 0);
    values_.assign(cap, 0);
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] == 0) continue;
      size_t k = hash(old_keys[i]) & (cap - 1);
      while (keys_[k] != 0) k = (k + 1) & (cap - 1);
      keys_[k] = old_keys[i];
      values_[k] = old_values[i];
    }
  }
  std::vector<uint64_t> keys_;  // 0: empty
  std::vector<uint8_t> values_;
  size_t n_ = 0;
};

class Resolver {
 public:
  // Splits of one token looked up at a time; a token with more is simulated on the stack.
  static constexpr int32_t kMaxSplits = 16;

  Resolver(const CompiledGrammar& g, const GrammarStack& s, uint64_t* mask)
      : g_(g), v_(g.vocab()), s_(s), mask_(mask), entries_(s.size(), nullptr) {}

  // ORs into the mask every token s[0..j] consumes. False when a depth bound could pass (the mask
  // then holds a subset of the answer).
  bool or_mask(int32_t j) {
    const TokenEntry* e = entry(j);
    if (!e) return false;
    if (!e->accepted_bits.empty()) {
      const uint64_t* b = e->accepted_bits.data();
      const int64_t n_words = v_.mask_words();
      for (int64_t w = 0; w < n_words; ++w) mask_[w] |= b[w];
    } else {
      for (int32_t t : e->accepted_ids) set(mask_, t);
    }
    if (j == 0) return true;
    if (e->pops_at_start && !or_mask(j - 1)) return false;
    const std::vector<TokenEntry::SplitRange>& sp = e->splits;
    const int32_t* ids = v_.token_ids().data();
    const int32_t* node_tokens = v_.node_tokens().data();
    for (size_t g = 0; g + 1 < e->split_groups.size(); ++g) {
      const size_t begin = static_cast<size_t>(e->split_groups[g]), end = static_cast<size_t>(e->split_groups[g + 1]);
      // A first byte of the rest that the stack below refuses rules out the whole group.
      const int32_t first = v_.byte_token(sp[begin].first);
      if (first >= 0 && !consumes(j - 1, first)) continue;
      for (size_t i = begin; i < end; ++i) {
        const TokenEntry::SplitRange& r = sp[i];
        for (int32_t k = node_tokens[r.from]; k < node_tokens[r.to]; ++k) {
          const int32_t t = ids[k];
          if (bit(mask_, t)) continue;
          const int32_t u = v_.suffix_at(k, r.at);
          if (u >= 0 ? consumes(j - 1, u) : bytes_consumed(j - 1, t, r.at)) set(mask_, t);
        }
      }
    }
    for (int32_t t : e->check_on_stack)
      if (!bit(mask_, t) && simulate(j, v_.bytes(t))) set(mask_, t);
    return !failed_;
  }

 private:
  // The entry of s[j] with s[0..j-1] below it, or null (failed_) when the two could pass
  // kMaxStackDepth together.
  const TokenEntry* entry(int32_t j) {
    const TokenEntry*& e = entries_[j];
    if (!e) {
      std::unique_ptr<TokenEntry> hold;
      e = g_.token_entry(s_[j], j == 0, &hold);
      if (hold) held_.push_back(std::move(hold));  // past the grammar's entry budget: ours for this mask
    }
    if (static_cast<size_t>(j) + static_cast<size_t>(e->max_depth) > kMaxStackDepth) {
      failed_ = true;
      return nullptr;
    }
    return e;
  }

  // Whether s[0..j] consumes the token's bytes.
  bool consumes(int32_t j, int32_t token) {
    bool found = false;
    uint8_t* slot = memo_.find_or_add(j, token, 0, &found);
    if (found) return *slot;
    const TokenEntry* e = entry(j);
    if (!e) return false;
    bool r = e->accepts(token);
    if (!r && j > 0) {
      if (e->pops_at_start) r = consumes(j - 1, token);
      int32_t at[kMaxSplits];
      const int32_t n = r ? 0 : e->splits_of(v_, token, at, kMaxSplits);
      for (int32_t k = 0; k < n && !r; ++k) r = rest_consumed(j - 1, token, at[k]);
      if (!r && (n == kMaxSplits || e->check_on_stack_has(token))) r = simulate(j, v_.bytes(token));
    }
    // The memo may have grown meanwhile: look the slot up again.
    *memo_.find_or_add(j, token, 0, &found) = r;
    return r;
  }

  // Whether s[0..j] consumes the token's bytes from `at` on.
  bool rest_consumed(int32_t j, int32_t token, int32_t at) {
    const int32_t u = v_.suffix_token(token, at);
    return u >= 0 ? consumes(j, u) : bytes_consumed(j, token, at);
  }

  // rest_consumed() for a rest that is no token: stepped through s[j] while its frame is one state
  // that calls nothing, continuing below wherever the frame can end; a simulation otherwise.
  // Memoised: the frames below may be reached at many split points.
  bool bytes_consumed(int32_t j, int32_t token, int32_t at) {
    if (!Memo::fits(at)) return step_rest(j, token, at);
    bool found = false;
    uint8_t* slot = memo_.find_or_add(j, token, at, &found);
    if (found) return *slot;
    const bool r = step_rest(j, token, at);
    *memo_.find_or_add(j, token, at, &found) = r;
    return r;
  }

  bool step_rest(int32_t j, int32_t token, int32_t at) {
    const GrammarAutomaton& a = g_.automaton();
    const std::string_view bytes = v_.bytes(token).substr(static_cast<size_t>(at));
    int32_t state = s_[j];
    if (a.has_calls(state)) return simulate(j, bytes);
    if (a.is_final(state) && j > 0 && rest_consumed(j - 1, token, at)) return true;
    for (size_t k = 0; k < bytes.size(); ++k) {
      const int32_t n = a.next(state, static_cast<uint8_t>(bytes[k]));
      if (n < 0) return false;
      if (a.has_calls(n)) return simulate(j, bytes);
      if (k + 1 == bytes.size()) return a.consumes(n) || a.is_final(n);
      if (a.is_final(n) && j > 0 && rest_consumed(j - 1, token, at + static_cast<int32_t>(k) + 1)) return true;
      state = n;
    }
    return true;
  }

  // Whether s[0..j], its top expanded (it may be a return state), consumes the bytes.
  bool simulate(int32_t j, std::string_view bytes) const {
    const GrammarAutomaton& a = g_.automaton();
    StackSet cur, next;
    if (!expand_stack(a, GrammarStack(s_.begin(), s_.begin() + j + 1), &cur) || !normalize(&cur)) return false;
    for (char c : bytes) {
      if (cur.live.empty()) return false;
      if (!step_byte(a, cur, static_cast<uint8_t>(c), &next)) return false;
      std::swap(cur, next);
    }
    return cur.alive();
  }

  const CompiledGrammar& g_;
  const TokenVocab& v_;
  const GrammarStack& s_;
  uint64_t* mask_;
  Memo memo_;
  std::vector<const TokenEntry*> entries_;  // [stack size]: of each frame, once looked up
  std::vector<std::unique_ptr<TokenEntry>> held_;
  bool failed_ = false;
};

}  // namespace

void or_stack_mask(const CompiledGrammar& g, const GrammarStack& stack, uint64_t* mask) {
  if (stack.empty()) return;
  Resolver r(g, stack, mask);
  if (!r.or_mask(static_cast<int32_t>(stack.size()) - 1)) g.or_allowed_full(stack, mask);
}

}  // namespace afd::serve
