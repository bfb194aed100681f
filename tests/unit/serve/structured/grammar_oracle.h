// Test helper: a grammar text compiled with serve/structured's matcher, and whether it accepts a
// text fed byte by byte (accept_bytes per byte, then can_end).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>

#include "serve/structured/compiled_grammar.h"
#include "serve/structured/gbnf.h"
#include "serve/structured/matcher.h"
#include "serve/structured/token_vocab.h"

namespace afd::serve::testing {

class GrammarOracle {
 public:
  // Fails the test (and accepts nothing) when the text does not parse or compile.
  explicit GrammarOracle(const std::string& gbnf) {
    auto g = parse_gbnf(gbnf);
    if (!g.ok()) {
      ADD_FAILURE() << "parse_gbnf: " << g.status().message() << "\n" << gbnf.substr(0, 4000);
      return;
    }
    static const auto vocab = TokenVocab::from_bytes({"{", "}", "\""}, {});
    auto c = CompiledGrammar::compile(*g, vocab);
    if (!c.ok()) {
      ADD_FAILURE() << "compile: " << c.status().message();
      return;
    }
    compiled_ = *c;
  }
  bool ok() const { return compiled_ != nullptr; }
  // Every byte accepted in turn, and the text a complete root.
  bool accepts(std::string_view text) const {
    if (!compiled_) return false;
    GrammarMatcher m(compiled_);
    for (char c : text) {
      if (!m.accept_bytes(std::string_view(&c, 1))) return false;
    }
    return m.can_end();
  }

 private:
  std::shared_ptr<const CompiledGrammar> compiled_;
};

}  // namespace afd::serve::testing
