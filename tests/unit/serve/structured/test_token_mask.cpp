#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar_test_util.h"
#include "serve/text/tokenizer.h"
#include "serve/text/unicode.h"

namespace afd::serve::test_token_mask {
namespace {

using testing::compile_or_die;
using testing::expect_mask_matches_oracle;

// A tokenizer whose vocabulary is every byte, JSON-ish fragments, words, multi-byte UTF-8 pieces
// cut inside code points, a special end token, a special non-end token and a non-special added one.
struct TestVocab {
  std::shared_ptr<const Tokenizer> tok;
  std::shared_ptr<const TokenVocab> vocab;
  int32_t eos = -1, special = -1, added = -1;
};

const TestVocab& test_vocab() {
  static const TestVocab v = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
    for (const char* s : {"{\"", "\":", "\",", "\"}", "\"]", "}}", "},", "]]", "],", "[[", "[{", "{}", "[]", "\":\"",
                          "\", \"", "true", "false", "null", "12", "345", "0.", ".5", "e+", "-1", "name", "age", "na",
                          "me\"", " \"", "\n  ", "  ", "\\n", "\\\"", "\\u00", "ab", "abc", "bc", "aa", "aaa", "ba",
                          "((", "))", "()", "[(", ")]", "\"a", "a\"", "x\"}", "\"x", "é", "\xC3", "\xA9\"", "😀",
                          "\xF0\x9F", "\x98\x80", "αβ", "ω\"", "\xCE", "\xB1\xCE", "<<", ">>", "<.", ".>", ">>>", "<.>",
                          // Tokens that close one or more levels and continue in an enclosing one; some rests
                          // (what follows the close) are tokens, some are not.
                          " }", "}]", "]}", "\"]}", "\"},{\"", "1,", "2]", "0}", " ,", ",\n", "\", \"", "}}]", "]],",
                          "a\",", " a", "  \"", ")))", "))]", "]))", "a)", "a].", "]].", "\n}", "\n]", "e\"", "ab\"}",
                          "5}}", "\"]]", "3],[", "}, {\"", "x\")", "a))"})
      pieces.push_back(s);
    nlohmann::json vocab = nlohmann::json::object();
    int32_t id = 0;
    for (const std::string& p : pieces) {
      const std::string key = bytes_to_byte_level(p);
      if (!vocab.contains(key)) vocab[key] = id++;
    }
    TestVocab t;
    t.eos = id, t.special = id + 1, t.added = id + 2;
    nlohmann::json j = {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
        {"added_tokens", nlohmann::json::array({{{"id", t.eos}, {"content", "<|end|>"}, {"special", true}},
                                                {{"id", t.special}, {"content", "<|tool|>"}, {"special", true}},
                                                {{"id", t.added}, {"content", "\"ok\""}, {"special", false}}})},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}}};
    auto tok = Tokenizer::from_json(j.dump());
    EXPECT_TRUE(tok.ok()) << tok.status().to_string();
    t.tok = *tok;
    t.vocab = TokenVocab::build(*t.tok, {t.eos}, t.tok->vocab_size() + 5);  // the model's vocab is larger
    return t;
  }();
  return v;
}

const char* kJsonValue = R"g(root ::= ws value ws
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n]{0,3}
)g";

const char* kObjectSchema = R"g(root ::= "{" space name-kv "," space age-kv ( "," space tags-kv )? "}" space
name-kv ::= "\"name\"" space ":" space string
age-kv ::= "\"age\"" space ":" space integer
tags-kv ::= "\"tags\"" space ":" space "[" space ( string ( "," space string )* )? "]" space
string ::= "\"" char{0,8} "\"" space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= "-"? ([0-9] | [1-9] [0-9]{1,5}) space
space ::= | " " | "\n" [ \t]{0,2}
)g";

const char* kBrackets = R"g(root ::= item* "."?
item ::= "[" item* "]" | "(" item* ")" | "a"+
)g";

const char* kAmbiguous = R"g(root ::= x x ("b" | "ab")* "ba"?
x ::= "a"* | "ab"
)g";

// A chain of 200 rules: too deep to inline in one machine, so machines without calls of their own
// are called (their entries have context-dependent tokens).
std::string deep_chain() {
  std::string g = "root ::= r0 \".\"?\n";
  for (int i = 0; i < 200; ++i) {
    g.append("r").append(std::to_string(i)).append(" ::= \"<\" r");
    g.append(std::to_string(i + 1)).append(" \">\"\n");
  }
  g += "r200 ::= \"x\"+\n";
  return g;
}

const char* kUnicode = R"g(root ::= ( [α-ω]+ | [^a-z\x00-\x1F"] | "😀" )* "\"")g";

// A repetition too large to inline, whose copies call the body's machine: an array of 2 to 3000
// strings.
const char* kCalledRepetitions = R"g(root ::= "[" space item ("," space item){1,2999} "]" space
item ::= "\"" char{0,8} "\"" space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
space ::= | " " | "\n" [ \t]{0,2}
)g";

// Random walks: at each step the mask must equal the oracle; then a random allowed token is taken
// (an end id when nothing else is allowed, or with probability 1/8 when allowed).
// *compiled: the grammar walked, when given.
void random_walks(const char* gbnf, int n_walks, int max_steps, uint32_t seed,
                  std::shared_ptr<const CompiledGrammar>* compiled = nullptr) {
  const TestVocab& tv = test_vocab();
  auto g = compile_or_die(gbnf, tv.vocab);
  ASSERT_TRUE(g);
  if (compiled) *compiled = g;
  std::mt19937 rng(seed);
  for (int w = 0; w < n_walks; ++w) {
    GrammarMatcher m(g);
    std::string text;
    for (int step = 0; step < max_steps && !m.is_finished(); ++step) {
      const std::string where = "walk " + std::to_string(w) + " after '" + text + "'";
      expect_mask_matches_oracle(m, where);
      if (::testing::Test::HasFailure()) return;
      std::vector<uint64_t> mask(static_cast<size_t>(m.mask_words()));
      m.fill_next_token_mask(mask.data());
      EXPECT_EQ((mask[tv.eos >> 6] >> (tv.eos & 63)) & 1, m.can_end() ? 1u : 0u) << where;
      EXPECT_EQ((mask[tv.special >> 6] >> (tv.special & 63)) & 1, 0u) << where;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < tv.vocab->vocab_size(); ++t)
        if ((mask[t >> 6] >> (t & 63)) & 1 && t != tv.eos) allowed.push_back(t);
      if (m.must_end()) {
        EXPECT_TRUE(allowed.empty()) << where;
      }
      if (m.can_end() && (allowed.empty() || rng() % 8 == 0)) {
        ASSERT_TRUE(m.accept_token(tv.eos)) << where;
        EXPECT_TRUE(m.is_finished());
        break;
      }
      ASSERT_FALSE(allowed.empty()) << where << ": dead end";
      const int32_t t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(t)) << where << " token " << t;
      text += tv.vocab->bytes(t);
    }
  }
}

TEST(TokenMask, JsonValueMatchesOracle) { random_walks(kJsonValue, 12, 40, 1); }
TEST(TokenMask, LongJsonWalksMatchOracle) { random_walks(kJsonValue, 6, 150, 11); }
TEST(TokenMask, LongBracketWalksMatchOracle) { random_walks(kBrackets, 6, 150, 13); }
TEST(TokenMask, ObjectSchemaMatchesOracle) { random_walks(kObjectSchema, 12, 60, 2); }
TEST(TokenMask, NestedBracketsMatchOracle) { random_walks(kBrackets, 12, 40, 3); }
TEST(TokenMask, AmbiguousGrammarMatchesOracle) { random_walks(kAmbiguous, 12, 30, 4); }
TEST(TokenMask, UnicodeClassesMatchOracle) { random_walks(kUnicode, 12, 30, 5); }
TEST(TokenMask, CalledRepetitionsMatchOracle) { random_walks(kCalledRepetitions, 10, 150, 7); }
TEST(TokenMask, CalledMachinesWithoutCallsMatchOracle) { random_walks(deep_chain().c_str(), 3, 500, 6); }

// Near kMaxStackDepth the per-frame entries cannot be combined (a token's local stack plus the
// frames below could pass the bound): the mask must still equal stepping the real stack.
// Long bounded repetitions whose positions far from their bounds share token entries (the test
// vocabulary's tokens are at most 6 bytes long): strings of 40 to 90 characters with escapes and
// multi-byte characters, inside a recursive rule (entries of states with calls) and at the top.
const char* kLongRepetitions = R"g(root ::= "[" item ("," item){0,99} "]" | str
item ::= str | "(" root ")" | "a"{0,70} "."
str ::= "\"" char{40,90} "\""
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
)g";

TEST(TokenMask, LongRepetitionsSharingEntriesMatchOracle) {
  std::shared_ptr<const CompiledGrammar> g;
  random_walks(kLongRepetitions, 16, 400, 21, &g);
  ASSERT_TRUE(g);
  EXPECT_GT(g->n_shared_entries(), 0);
}

TEST(TokenMask, EntriesSharedAcrossThreadsGiveTheMasksOfOneThread) {
  // Threads walk a long string through one grammar (sharing entries as they go, each its own
  // characters); every mask equals the one a fresh grammar computes alone.
  const char* gbnf = R"g(root ::= "\"" ( [^"\\] | "\\n" ){0,300} "\"")g";
  const TestVocab& tv = test_vocab();
  auto shared = compile_or_die(gbnf, tv.vocab);
  ASSERT_TRUE(shared);
  const std::vector<std::string> pieces = {"ab", "é", "\\n", "aaa"};
  auto masks_of = [&](const std::shared_ptr<const CompiledGrammar>& g, size_t i) {
    std::vector<std::vector<uint64_t>> out;
    GrammarMatcher m(g);
    if (!m.accept_bytes("\"")) return out;
    for (int k = 0; k < 120; ++k) {
      out.emplace_back(static_cast<size_t>(m.mask_words()));
      m.fill_next_token_mask(out.back().data());
      if (!m.accept_bytes(pieces[(i + static_cast<size_t>(k)) % pieces.size()])) break;
    }
    return out;
  };
  std::vector<std::vector<std::vector<uint64_t>>> results(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 4; ++i) threads.emplace_back([&, i] { results[i] = masks_of(shared, i); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(results[i].size(), 120u);
    EXPECT_TRUE(results[i] == masks_of(compile_or_die(gbnf, tv.vocab), i)) << "thread " << i;
  }
  EXPECT_GT(shared->n_shared_entries(), 0);
}

TEST(TokenMask, StacksNearTheDepthBoundMatchOracle) {
  const TestVocab& tv = test_vocab();
  auto g = compile_or_die(kBrackets, tv.vocab);
  ASSERT_TRUE(g);
  GrammarMatcher m(g);
  int n = 0;
  for (; n < 2 * static_cast<int>(kMaxStackDepth); ++n) {
    if (n % 101 == 0 || n + 8 >= static_cast<int>(kMaxStackDepth)) {
      expect_mask_matches_oracle(m, "after " + std::to_string(n) + " brackets");
      if (::testing::Test::HasFailure()) return;
    }
    if (!m.accept_bytes(n % 2 ? "[" : "(")) break;
  }
  EXPECT_GE(n, static_cast<int>(kMaxStackDepth) - 8);  // the bound was reached...
  EXPECT_LT(n, 2 * static_cast<int>(kMaxStackDepth));  // ...and refused the byte past it
}

// So ambiguous that the stacks together pass kMaxStacks: each stack decides alone, in the mask and
// in accept alike (found by fuzz_gbnf).
TEST(TokenMask, HugelyAmbiguousGrammarMaskEqualsAccept) {
  const TestVocab& tv = test_vocab();
  auto g = compile_or_die(R"g(root ::= ("{" root "}" | "[" root root "]")* "a"?)g", tv.vocab);
  ASSERT_TRUE(g);
  GrammarMatcher m(g);
  const std::string text = "[[{[a][{[[[][[[{[[";
  for (size_t i = 0; i < text.size(); ++i) {
    ASSERT_TRUE(m.accept_bytes(text.substr(i, 1))) << i;
    if (i + 4 >= text.size()) expect_mask_matches_oracle(m, "after '" + text.substr(0, i + 1) + "'");
    if (::testing::Test::HasFailure()) return;
  }
}

// An alternative that can never complete (an empty class matches nothing) is no way forward: its
// bytes are refused, so no accepted text leads to a dead end (found by fuzz_gbnf).
TEST(TokenMask, AlternativesThatCanNeverCompleteAreRefused) {
  auto g = compile_or_die(R"g(root ::= "x" ( "a" "b" [] | "c" | "{" root "}" ) | "d" [] root)g");
  ASSERT_TRUE(g);
  EXPECT_TRUE(testing::matches(g, "xc"));
  EXPECT_TRUE(testing::matches(g, "x{xc}"));
  EXPECT_FALSE(testing::is_prefix(g, "xa"));
  EXPECT_FALSE(testing::is_prefix(g, "x{xa"));
  EXPECT_FALSE(testing::is_prefix(g, "d"));
  GrammarMatcher m(g);
  for (const char* s : {"", "x", "{", "x", "{"}) {
    ASSERT_TRUE(m.accept_bytes(s)) << s;
    expect_mask_matches_oracle(m, std::string("after '") + s + "'");
  }
  const TestVocab& tv = test_vocab();
  auto fuzz_found = compile_or_die(R"g(root ::= ("{" root "}" | "[" root""" "[] root{1,3} "]")* "a"?)g", tv.vocab);
  ASSERT_TRUE(fuzz_found);
  GrammarMatcher f(fuzz_found);
  EXPECT_FALSE(f.accept_bytes("{["));
  ASSERT_TRUE(f.accept_bytes("{"));
  expect_mask_matches_oracle(f, "after '{'");
}

// With no room for cached entries every mask builds the entries it needs and drops them: the
// same masks, nothing held.
TEST(TokenMask, EntryBudgetSpentMasksStillMatchOracle) {
  const TestVocab& tv = test_vocab();
  auto parsed = parse_gbnf(kJsonValue);
  ASSERT_TRUE(parsed.ok());
  auto g = CompiledGrammar::compile(*parsed, tv.vocab, /*max_entry_bytes=*/0);
  ASSERT_TRUE(g.ok());
  GrammarMatcher m(*g);
  for (const char* s : {"", "{", "\"a\"", ":", " [", "1", ",", "{\"b\":", "\"x"}) {
    ASSERT_TRUE(m.accept_bytes(s)) << s;
    expect_mask_matches_oracle(m, std::string("after '") + s + "'");
  }
  EXPECT_EQ((*g)->n_cached_entries(), 0);
  EXPECT_EQ((*g)->cached_bytes(), 0u);
  EXPECT_GT((*g)->n_uncached_builds(), 0);
}

// The precomputed rests of tokens, trie nodes and one-byte tokens agree with looking bytes up.
TEST(TokenMask, VocabularySuffixTableMatchesFind) {
  const TestVocab& tv = test_vocab();
  const TokenVocab& v = *tv.vocab;
  int n_found = 0;
  for (int32_t id = 0; id < v.vocab_size(); ++id) {
    if (!v.is_text(id)) {
      EXPECT_EQ(v.find(v.bytes(id)), -1) << id;
      continue;
    }
    const std::string_view b = v.bytes(id);
    EXPECT_EQ(v.bytes(v.find(b)), b);
    EXPECT_LE(v.find(b), id);
    const int32_t node = v.token_node(id);
    EXPECT_EQ(v.node_depth()[node], static_cast<int32_t>(b.size()));
    EXPECT_EQ(v.node_byte()[node], static_cast<uint8_t>(b.back()));
    for (int32_t at = 1; at < static_cast<int32_t>(b.size()); ++at) {
      const int32_t u = v.suffix_token(id, at);
      EXPECT_EQ(u, v.find(b.substr(static_cast<size_t>(at)))) << id << " at " << at;
      n_found += u >= 0;
    }
  }
  EXPECT_GT(n_found, 50);
  for (int b = 0; b < 256; ++b)
    EXPECT_EQ(v.byte_token(static_cast<uint8_t>(b)), v.find(std::string(1, static_cast<char>(b))));
  EXPECT_EQ(v.find("no such token"), -1);
}

TEST(TokenMask, EndIdsOnlyWhenCompleteAndSpecialsNever) {
  const TestVocab& tv = test_vocab();
  auto g = compile_or_die(R"g(root ::= "\"ok\"" | "a")g", tv.vocab);
  GrammarMatcher m(g);
  EXPECT_FALSE(m.is_allowed(tv.eos));
  EXPECT_FALSE(m.accept_token(tv.eos));
  EXPECT_FALSE(m.is_allowed(tv.special));
  EXPECT_TRUE(m.is_allowed(tv.added));  // a non-special added token matches by its bytes
  EXPECT_FALSE(m.is_allowed(static_cast<int32_t>(tv.tok->vocab_size())));  // model-only id
  GrammarMatcher snapshot = m;
  ASSERT_TRUE(m.accept_token(tv.added));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.must_end());
  std::vector<uint64_t> mask(static_cast<size_t>(m.mask_words()));
  m.fill_next_token_mask(mask.data());
  for (int64_t t = 0; t < tv.vocab->vocab_size(); ++t)
    EXPECT_EQ((mask[t >> 6] >> (t & 63)) & 1, t == tv.eos ? 1u : 0u) << t;
  ASSERT_TRUE(m.accept_token(tv.eos));
  EXPECT_TRUE(m.is_finished());
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_token(tv.eos));
  m.fill_next_token_mask(mask.data());
  for (uint64_t w : mask) EXPECT_EQ(w, 0u);
  // The snapshot did not move.
  EXPECT_FALSE(snapshot.can_end());
  EXPECT_TRUE(snapshot.accept_bytes("a"));
}

TEST(TokenMask, RejectedTokenLeavesMatcherUnchanged) {
  auto g = compile_or_die(R"g(root ::= "ab" "c")g");
  GrammarMatcher m(g);
  EXPECT_FALSE(m.accept_bytes("ax"));
  EXPECT_TRUE(m.accept_bytes("a"));
  EXPECT_FALSE(m.accept_token('c'));
  EXPECT_TRUE(m.accept_token('b'));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("c"));
  EXPECT_TRUE(m.must_end());
}

// Many matchers on several threads share one compiled grammar while its entries are built.
TEST(TokenMask, SharedCompiledGrammarAcrossThreads) {
  const TestVocab& tv = test_vocab();
  auto g = compile_or_die(kJsonValue, tv.vocab);
  ASSERT_TRUE(g);
  std::vector<std::vector<uint64_t>> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      GrammarMatcher m(g);
      m.accept_bytes("{\"a\": [1, \"x");
      results[i].resize(static_cast<size_t>(m.mask_words()));
      m.fill_next_token_mask(results[i].data());
    });
  for (auto& t : threads) t.join();
  for (int i = 1; i < 4; ++i) EXPECT_EQ(results[i], results[0]);
}

}  // namespace
}  // namespace afd::serve::test_token_mask
