#include <gtest/gtest.h>

#include "serve/structured/gbnf_builder.h"

namespace afd::serve::test_regex_gbnf {
namespace {

void expect_refused(const char* pattern, const std::string& fragment) {
  auto r = regex_to_gbnf(pattern);
  ASSERT_FALSE(r.ok()) << pattern;
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
}

TEST(RegexErrors, UnsupportedConstructsAreNamed) {
  expect_refused(R"((a)\1)", "backreferences");
  expect_refused(R"((?<n>a)\k<n>)", "backreferences");
  expect_refused(R"(a(?=b))", "lookahead");
  expect_refused(R"(a(?!b))", "lookahead");
  expect_refused(R"((?<=a)b)", "lookbehind");
  expect_refused(R"(\bword)", "word boundaries");
  expect_refused(R"((?i)abc)", "flags");
  expect_refused(R"(\p{L})", "property");
  expect_refused(R"(a^b)", "'^'");
  expect_refused(R"((a$))", "'$'");
  expect_refused(R"(*a)", "nothing to repeat");
  expect_refused(R"(a**)", "nothing to repeat");
  expect_refused(R"((ab)", "unbalanced");
  expect_refused(R"(ab))", "unbalanced");
  expect_refused(R"([abc)", "unterminated");
  expect_refused(R"(a{3,2})", "m > n");
  expect_refused(R"(a{100000})", "repetition count");
  expect_refused(R"([z-a])", "out of order");
  expect_refused(R"(\q)", "unknown escape");
}

TEST(RegexErrors, DeepNestingAndLongPatternsFailCleanly) {
  std::string deep(1000, '(');
  deep += "a" + std::string(1000, ')');
  auto r = regex_to_gbnf(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nest deeper"), std::string::npos) << r.status().message();
  EXPECT_FALSE(regex_to_gbnf(std::string(100000, 'a')).ok());
}

}  // namespace
}  // namespace afd::serve::test_regex_gbnf
