// Test helpers for the structured-output grammar tests: a byte vocabulary, byte-level matching of
// whole strings, and a brute-force mask oracle.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "serve/structured/compiled_grammar.h"
#include "serve/structured/gbnf.h"
#include "serve/structured/matcher.h"
#include "serve/structured/token_vocab.h"

namespace afd::serve::testing {

// 256 one-byte tokens (id == byte) and an end id 256.
inline std::shared_ptr<const TokenVocab> byte_vocab() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  return TokenVocab::from_bytes(std::move(bytes), {256});
}

inline std::shared_ptr<const CompiledGrammar> compile_or_die(std::string_view gbnf,
                                                             std::shared_ptr<const TokenVocab> vocab = byte_vocab()) {
  auto g = parse_gbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().to_string() << "\n" << gbnf;
  if (!g.ok()) return nullptr;
  auto c = CompiledGrammar::compile(*g, std::move(vocab));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : nullptr;
}

// The whole string is a `root`.
inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.accept_bytes(s) && m.can_end();
}
// The string can be continued into a `root` (every byte accepted).
inline bool is_prefix(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.accept_bytes(s);
}

// Checks the mask and is_allowed() of m against accepting each token on a copy.
inline void expect_mask_matches_oracle(const GrammarMatcher& m, const std::string& where) {
  const TokenVocab& v = m.grammar().vocab();
  std::vector<uint64_t> mask(static_cast<size_t>(m.mask_words()), ~uint64_t{0});
  m.fill_next_token_mask(mask.data());
  int n_bad = 0;
  for (int32_t t = 0; t < v.vocab_size() && n_bad < 5; ++t) {
    GrammarMatcher copy = m;
    const bool oracle = copy.accept_token(t);
    const bool bit = (mask[t >> 6] >> (t & 63)) & 1;
    if (bit != oracle || m.is_allowed(t) != oracle) {
      ++n_bad;
      ADD_FAILURE() << where << ": token " << t << " '" << v.bytes(t) << "' oracle " << oracle << " mask " << bit
                    << " is_allowed " << m.is_allowed(t);
    }
  }
  for (int64_t t = v.vocab_size(); t < m.mask_words() * 64; ++t)
    EXPECT_FALSE((mask[t >> 6] >> (t & 63)) & 1) << where << ": bit past the vocabulary " << t;
}

}  // namespace afd::serve::testing
