#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "grammar_test_util.h"
#include "serve/structured/grammar_cache.h"

namespace afd::serve::test_grammar_cache {
namespace {

TEST(GrammarCache, SameTextSameObjectAndLruEviction) {
  GrammarCache cache(testing::byte_vocab(), 2);
  auto a = cache.get(R"g(root ::= "a")g");
  ASSERT_TRUE(a.ok());
  auto a2 = cache.get(R"g(root ::= "a")g");
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a->get(), a2->get());
  EXPECT_EQ(cache.n_compiled(), 1);
  ASSERT_TRUE(cache.get(R"g(root ::= "b")g").ok());
  ASSERT_TRUE(cache.get(R"g(root ::= "a")g").ok());  // a is now the most recent
  ASSERT_TRUE(cache.get(R"g(root ::= "c")g").ok());  // evicts b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.n_compiled(), 3);
  auto a3 = cache.get(R"g(root ::= "a")g");
  EXPECT_EQ(a3->get(), a->get());
  EXPECT_EQ(cache.n_compiled(), 3);
  ASSERT_TRUE(cache.get(R"g(root ::= "b")g").ok());
  EXPECT_EQ(cache.n_compiled(), 4);
}

TEST(GrammarCache, ErrorsAreReturnedAndNotKept) {
  GrammarCache cache(testing::byte_vocab());
  auto bad = cache.get("root ::= missing");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "line 1, column 10: rule 'missing' is not defined");
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.get("root ::= missing").ok());
  EXPECT_EQ(cache.n_compiled(), 2);
}

TEST(GrammarCache, ConcurrentGetsCompileOnce) {
  GrammarCache cache(testing::byte_vocab());
  const std::string text = R"g(root ::= "{" [a-z]{1,200} "}")g";
  std::vector<const CompiledGrammar*> got(8, nullptr);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      auto g = cache.get(text);
      if (g.ok()) got[i] = g->get();
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    ASSERT_NE(got[i], nullptr);
    EXPECT_EQ(got[i], got[0]);
  }
  EXPECT_EQ(cache.n_compiled(), 1);
}

// A grammar's bytes grow as masks build its entries; past max_bytes the least recently used
// grammars go, never the one returned.
TEST(GrammarCache, ByteBudgetEvictsLeastRecentlyUsed) {
  auto vocab = testing::byte_vocab();
  const std::string a = R"g(root ::= "{" [a-z]{1,20} "}")g", b = R"g(root ::= "[" [0-9]{1,20} "]")g",
                    c = R"g(root ::= "<" [a-f]{1,20} ">")g";
  size_t one = 0;
  {
    GrammarCache probe(vocab);
    auto g = probe.get(a);
    ASSERT_TRUE(g.ok());
    one = (*g)->memory_bytes();
    EXPECT_EQ(probe.bytes(), one + a.size());
  }
  GrammarCache cache(vocab, 256, {}, 2 * one + 100);  // room for two fresh grammars
  auto ga = cache.get(a);
  auto gb = cache.get(b);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(cache.size(), 2u);
  // Masks over a's states grow it past the budget's share: the next get() drops b (older than a).
  ASSERT_TRUE(cache.get(a).ok());
  GrammarMatcher m(*ga);
  std::vector<uint64_t> mask(static_cast<size_t>(m.mask_words()));
  for (const char* s : {"{", "a", "b", "c"}) {
    m.fill_next_token_mask(mask.data());
    ASSERT_TRUE(m.accept_bytes(s));
  }
  EXPECT_GT((*ga)->memory_bytes(), one + 100);
  ASSERT_TRUE(cache.get(a).ok());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_LE(cache.bytes(), (*ga)->memory_bytes() + a.size());
  const int64_t compiled = cache.n_compiled();
  ASSERT_TRUE(cache.get(a).ok());
  EXPECT_EQ(cache.n_compiled(), compiled);  // a stayed
  // A new grammar is kept even when it alone passes the budget; the older ones go.
  GrammarCache tiny(vocab, 256, {}, 1);
  ASSERT_TRUE(tiny.get(a).ok());
  ASSERT_TRUE(tiny.get(c).ok());
  EXPECT_EQ(tiny.size(), 1u);
  EXPECT_EQ(tiny.n_compiled(), 2);
  ASSERT_TRUE(tiny.get(c).ok());
  EXPECT_EQ(tiny.n_compiled(), 2);
}

}  // namespace
}  // namespace afd::serve::test_grammar_cache
