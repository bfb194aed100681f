// Exhaustive checks against independent oracles: number bounds against arithmetic over every
// value of a grid (written in several spellings), regexes against std::regex (ECMAScript) over
// every short string of a small alphabet, as whole matches and as JSON Schema searches.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/structured/gbnf_builder.h"
#include "tests/unit/serve/structured/grammar_oracle.h"

namespace afd::serve::test_exhaustive_oracles {
namespace {

using Json = nlohmann::ordered_json;
using testing::GrammarOracle;

std::string fixed(int64_t thousandths, int decimals) {
  // thousandths / 1000 with `decimals` fraction digits (0..3), exact when representable.
  bool neg = thousandths < 0;
  int64_t a = neg ? -thousandths : thousandths;
  std::string s = std::to_string(a / 1000);
  if (decimals > 0) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "%03lld", static_cast<long long>(a % 1000));
    s += "." + std::string(buf).substr(0, static_cast<size_t>(decimals));
  }
  return (neg && a != 0 ? "-" : "") + s;
}

TEST(NumberBoundsExhaustive, IntegersMatchArithmetic) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    int64_t lo = static_cast<int64_t>(rng() % 2401) - 1200, hi = lo + static_cast<int64_t>(rng() % 1300);
    bool lo_x = rng() % 2, hi_x = rng() % 2, has_lo = rng() % 5 != 0, has_hi = rng() % 5 != 0;
    if (!has_lo && !has_hi) has_lo = true;
    if (lo_x && hi_x && hi - lo < 2) hi = lo + 2;
    Json s = {{"type", "integer"}};
    if (has_lo) s[lo_x ? "exclusiveMinimum" : "minimum"] = lo;
    if (has_hi) s[hi_x ? "exclusiveMaximum" : "maximum"] = hi;
    auto gbnf = json_schema_to_gbnf(s);
    ASSERT_TRUE(gbnf.ok()) << s.dump() << gbnf.status().message();
    GrammarOracle g(*gbnf);
    for (int64_t x = -2600; x <= 2600; ++x) {
      bool in = (!has_lo || (lo_x ? x > lo : x >= lo)) && (!has_hi || (hi_x ? x < hi : x <= hi));
      ASSERT_EQ(g.accepts(std::to_string(x)), in) << s.dump() << " x=" << x;
    }
  }
}

TEST(NumberBoundsExhaustive, DecimalsMatchArithmetic) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    // Bounds in thousandths with 0..3 decimals.
    auto bound = [&] {
      int d = static_cast<int>(rng() % 4);
      int64_t step = d == 0 ? 1000 : d == 1 ? 100 : d == 2 ? 10 : 1;
      return (static_cast<int64_t>(rng() % 4001) - 2000) / step * step;
    };
    int64_t lo = bound(), hi = bound();
    if (lo > hi) std::swap(lo, hi);
    bool lo_x = rng() % 2, hi_x = rng() % 2, has_lo = rng() % 5 != 0, has_hi = rng() % 5 != 0;
    if (lo == hi) lo_x = hi_x = false;
    Json s = {{"type", "number"}};
    if (has_lo) s[lo_x ? "exclusiveMinimum" : "minimum"] = Json::parse(fixed(lo, 3));
    if (has_hi) s[hi_x ? "exclusiveMaximum" : "maximum"] = Json::parse(fixed(hi, 3));
    if (!has_lo && !has_hi) continue;
    auto gbnf = json_schema_to_gbnf(s);
    ASSERT_TRUE(gbnf.ok()) << s.dump() << gbnf.status().message();
    GrammarOracle g(*gbnf);
    for (int64_t x = -2500; x <= 2500; ++x) {
      bool in = (!has_lo || (lo_x ? x > lo : x >= lo)) && (!has_hi || (hi_x ? x < hi : x <= hi));
      // Every spelling of x with 3 decimals, and fewer when exact; a trailing zero digit too.
      for (int d = 0; d <= 3; ++d) {
        int64_t unit = d == 0 ? 1000 : d == 1 ? 100 : d == 2 ? 10 : 1;
        if (x % unit != 0) continue;
        std::string text = fixed(x, d);
        if (x == 0 && text[0] == '-') continue;
        ASSERT_EQ(g.accepts(text), in) << s.dump() << " text=" << text;
        if (d == 3) {
          ASSERT_EQ(g.accepts(text + "0"), in) << s.dump() << " text=" << text << "0";
        }
      }
    }
  }
}

// Every string over `alphabet` up to `max_len` characters.
std::vector<std::string> all_strings(const std::string& alphabet, size_t max_len) {
  std::vector<std::string> out{""};
  for (size_t begin = 0, len = 0; len < max_len; ++len) {
    size_t end = out.size();
    for (size_t i = begin; i < end; ++i) {
      for (char c : alphabet) out.push_back(out[i] + c);
    }
    begin = end;
  }
  return out;
}

const char* const kPatterns[] = {
    "a*b",       "(ab|a)*c?",   "[a-c]{2,3}", "[^b]+",      "a?b?c?",        "(a|b|)c",     "a{0,2}(bc)+",
    "^ab",       "bc$",         "^a|c$",      "\\d+",       "[a-]+1?",       "(?:a|bb){2}", "b.c",
    "[\\w-]{3}", "a+?b*?",      "",           "^$",         "(a(b(c)?)?)?",  "[ab]*-[12]",  "\\D\\d",
};

TEST(RegexExhaustive, WholeMatchesAgreeWithStdRegex) {
  auto texts = all_strings("abc-1", 5);
  for (const char* p : kPatterns) {
    auto gbnf = regex_to_gbnf(p);
    ASSERT_TRUE(gbnf.ok()) << p << ": " << gbnf.status().message();
    GrammarOracle g(*gbnf);
    std::string whole = p;  // regex_to_gbnf matches the whole text, anchors or not
    std::regex re(whole, std::regex::ECMAScript);
    for (const auto& t : texts) {
      bool expected = std::regex_match(t, re);
      if (whole.find('^') != std::string::npos || whole.find('$') != std::string::npos) {
        expected = std::regex_match(t, std::regex("(?:" + whole + ")", std::regex::ECMAScript));
      }
      ASSERT_EQ(g.accepts(t), expected) << "pattern " << p << " text '" << t << "'";
    }
  }
}

TEST(RegexExhaustive, SchemaPatternsAreSearchesInsideJsonStrings) {
  auto texts = all_strings("ab\"\\c", 4);
  for (const char* p : kPatterns) {
    Json schema = {{"type", "string"}, {"pattern", p}};
    auto gbnf = json_schema_to_gbnf(schema);
    ASSERT_TRUE(gbnf.ok()) << p << ": " << gbnf.status().message();
    GrammarOracle g(*gbnf);
    std::regex re(p, std::regex::ECMAScript);
    for (const auto& t : texts) {
      bool expected = std::regex_search(t, re);
      ASSERT_EQ(g.accepts(Json(t).dump()), expected) << "pattern " << p << " text " << Json(t).dump();
    }
  }
}

}  // namespace
}  // namespace afd::serve::test_exhaustive_oracles
