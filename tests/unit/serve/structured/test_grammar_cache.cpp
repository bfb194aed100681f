#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "grammar_test_util.h"
#include "serve/structured/grammar_cache.h"

namespace afd::serve {
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

}  // namespace
}  // namespace afd::serve
