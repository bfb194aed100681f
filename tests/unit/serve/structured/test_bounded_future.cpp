#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "grammar_test_util.h"
#include "serve/structured/bounded_future.h"
#include "serve/structured/grammar.h"
#include "serve/structured/stack_set.h"
#include "serve/structured/token_entry.h"

namespace afd::serve::test_bounded_future {
namespace {

using testing::compile_or_die;

// The state after k bytes `a` of "a"{10,100} "b", for k in [0, 100].
std::vector<int32_t> chain_states(const GrammarAutomaton& a) {
  std::vector<int32_t> s = {a.root_start};
  for (int k = 1; k <= 100; ++k) s.push_back(a.next(s.back(), 'a'));
  return s;
}

TEST(BoundedFuture, PositionsAreAlikeExactlyWhenTheirBoundsAreEquallyFarWithinTheDepth) {
  auto g = compile_or_die(R"(root ::= "a"{10,100} "b")");
  ASSERT_TRUE(g);
  const GrammarAutomaton& a = g->automaton();
  const std::vector<int32_t> s = chain_states(a);
  for (int32_t x : s) ASSERT_GE(x, 0);
  static constexpr int32_t kDepth = 5;
  // Within 5 bytes, state k sees "b" allowed after j < 5 more a's iff j >= 10 - k, and a^j allowed
  // for j <= min(5, 100 - k).
  auto near_min = [](int k) { return std::clamp(10 - k, 0, kDepth); };
  auto near_max = [](int k) { return std::min(100 - k, kDepth); };
  for (int k = 0; k <= 100; ++k)
    for (int j = 0; j <= 100; ++j) {
      const bool expected = near_min(k) == near_min(j) && near_max(k) == near_max(j);
      EXPECT_EQ(same_bounded_future(a, s[k], s[j], kDepth, 1 << 20), expected) << k << " vs " << j;
      if (expected) {
        EXPECT_EQ(bounded_future_key(a, s[k], kDepth), bounded_future_key(a, s[j], kDepth)) << k << " vs " << j;
      }
    }
  // A search past its pair budget shares nothing.
  EXPECT_FALSE(same_bounded_future(a, s[20], s[30], kDepth, 2));
}

TEST(BoundedFuture, AlikeStatesHaveEqualTokenEntries) {
  // Tokens of up to 4 bytes over {a, b}; entries of alike states (depth 4) must be equal.
  std::vector<std::string> tokens;
  for (int len = 1; len <= 4; ++len)
    for (int bits = 0; bits < (1 << len); ++bits) {
      std::string t;
      for (int i = 0; i < len; ++i) t.push_back((bits >> i) & 1 ? 'b' : 'a');
      tokens.push_back(t);
    }
  auto vocab = TokenVocab::from_bytes(tokens, {});
  ASSERT_EQ(vocab->max_depth(), 4);
  auto g = compile_or_die(R"(root ::= "a"{10,100} "b")", vocab);
  ASSERT_TRUE(g);
  const GrammarAutomaton& a = g->automaton();
  const std::vector<int32_t> s = chain_states(a);
  auto accepted = [&](int32_t state, bool bottom) {
    auto e = build_token_entry(a, *vocab, state, bottom);
    std::vector<int32_t> ids;
    for (int32_t t = 0; t < vocab->vocab_size(); ++t)
      if (e->accepts(t)) ids.push_back(t);
    std::vector<std::pair<int32_t, int32_t>> splits;
    for (const TokenEntry::SplitRange& r : e->splits) splits.push_back({r.from * 1000 + r.to, r.at});
    return std::make_pair(ids, splits);
  };
  int n_alike = 0;
  for (int k = 0; k <= 100; ++k)
    for (int j = k + 1; j <= 100; ++j) {
      if (!same_bounded_future(a, s[k], s[j], 4, 1 << 20)) continue;
      ++n_alike;
      for (bool bottom : {false, true}) EXPECT_EQ(accepted(s[k], bottom), accepted(s[j], bottom)) << k << " vs " << j;
    }
  EXPECT_GT(n_alike, 1000);
}

TEST(BoundedFuture, EntriesSharedThroughTheCompiledGrammarKeepMasksExact) {
  // Masks at every position of a long string, each against accepting each token on a copy; the
  // positions far from both bounds share entries.
  auto vocab = TokenVocab::from_bytes({"x", "xx", "xxx", "\"", "x\"", "\"\"", "é", "\\n"}, {8});
  auto g = compile_or_die(R"(root ::= "\"" ([^"\\] | "\\n"){30,200} "\"")", vocab);
  ASSERT_TRUE(g);
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes("\""));
  for (int k = 0; k < 200; ++k) {
    testing::expect_mask_matches_oracle(m, "after " + std::to_string(k) + " characters");
    ASSERT_TRUE(m.accept_bytes(k % 7 == 3 ? "\\n" : k % 5 == 1 ? "é" : "x"));
  }
  testing::expect_mask_matches_oracle(m, "at the bound");
  ASSERT_TRUE(m.accept_bytes("\""));
  EXPECT_TRUE(m.can_end());
  EXPECT_GT(g->n_shared_entries(), 100);
}

TEST(BoundedFuture, CalledCopiesShareEntriesOnlyFarFromTheirBound) {
  // Each item is a call (the rule is recursive), so the count lives in the return states.
  auto vocab = TokenVocab::from_bytes({"x", "xx", "xxx", "]", "x]", "xx]", "(", ")", "()", "x(", "[", "[]"}, {12});
  auto g = compile_or_die("root ::= \"[\" item{0,80} \"]\"\nitem ::= \"x\" | \"(\" root \")\"", vocab);
  ASSERT_TRUE(g);
  // The state after k items: the stack of one frame among those after "[" and k "x".
  const GrammarAutomaton& a = g->automaton();
  std::vector<int32_t> after;
  StackSet cur = initial_stacks(a), next;
  ASSERT_TRUE(step_byte(a, cur, '[', &next));
  for (int k = 0; k <= 80; ++k) {
    for (const GrammarStack& s : next.live)
      if (s.size() == 1) after.push_back(s[0]);
    ASSERT_EQ(after.size(), static_cast<size_t>(k) + 1);
    cur = next;
    if (k < 80) {
      ASSERT_TRUE(step_byte(a, cur, 'x', &next));
    }
  }
  // Depth 3: the count shows through return states one byte apart; a frame 3 bytes on is compared
  // by its calls too, so positions are alike when equal up to 4 items from the bound.
  for (int k = 0; k <= 80; ++k)
    for (int j = 0; j <= 80; ++j)
      EXPECT_EQ(same_bounded_future(a, after[k], after[j], 3, 1 << 20), std::min(80 - k, 4) == std::min(80 - j, 4))
          << k << " vs " << j;

  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes("["));
  for (int k = 0; k < 80; ++k) {
    testing::expect_mask_matches_oracle(m, "after " + std::to_string(k) + " items");
    ASSERT_TRUE(m.accept_bytes("x"));
  }
  testing::expect_mask_matches_oracle(m, "after 80 items");
  EXPECT_GT(g->n_shared_entries(), 50);
}

}  // namespace
}  // namespace afd::serve::test_bounded_future
