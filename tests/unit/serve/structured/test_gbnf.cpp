#include <gtest/gtest.h>

#include <string>

#include "grammar_test_util.h"
#include "serve/structured/gbnf.h"

namespace afd::serve::test_gbnf {
namespace {

using testing::compile_or_die;
using testing::is_prefix;
using testing::matches;

std::string parse_error(std::string_view text, const GrammarLimits& limits = {}) {
  auto g = parse_gbnf(text, limits);
  if (g.ok()) return "ok";
  EXPECT_EQ(g.status().code(), StatusCode::invalid_argument);
  return g.status().message();
}

TEST(Gbnf, LiteralsSequencesAndAlternatives) {
  auto g = compile_or_die(R"g(root ::= "ab" "c" | "x" | "")g");
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "x"));
  EXPECT_TRUE(matches(g, ""));
  EXPECT_FALSE(matches(g, "ab"));
  EXPECT_TRUE(is_prefix(g, "ab"));
  EXPECT_FALSE(is_prefix(g, "abcd"));
  EXPECT_FALSE(is_prefix(g, "y"));
}

TEST(Gbnf, EscapesNameCodePoints) {
  auto g = compile_or_die(R"g(root ::= "\n\r\t\\\"\[\]" "\x41\u00e9\U0001F600")g");
  EXPECT_TRUE(matches(g, "\n\r\t\\\"[]A\xC3\xA9\xF0\x9F\x98\x80"));
  auto raw = compile_or_die("root ::= \"é😀\"");
  EXPECT_TRUE(matches(raw, "\xC3\xA9\xF0\x9F\x98\x80"));
}

TEST(Gbnf, CharacterClassesMatchOneCodePointByteByByte) {
  auto g = compile_or_die(R"g(root ::= [a-c0-9_] [α-ω] [^a-z] .)g");
  EXPECT_TRUE(matches(g, "bβZx"));
  EXPECT_TRUE(matches(g, "5ω\xE2\x82\xAC\xF0\x9F\x98\x80"));  // euro sign, emoji
  EXPECT_FALSE(matches(g, "dβZx"));
  EXPECT_FALSE(matches(g, "bbZx"));
  EXPECT_FALSE(matches(g, "bβzx"));
  // A partial code point is a prefix, an impossible continuation byte is not.
  EXPECT_TRUE(is_prefix(g, "b\xCE"));
  EXPECT_FALSE(is_prefix(g, "b\xCE\x80"));  // U+0380 is below alpha
  EXPECT_FALSE(is_prefix(g, "b\xC0"));
  // Negated classes and `.` never match a byte that is no UTF-8 (a lone continuation, an overlong
  // lead, a surrogate).
  auto dot = compile_or_die(R"g(root ::= [^"]*)g");
  EXPECT_TRUE(matches(dot, "h\xC3\xA9llo \xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(is_prefix(dot, "\x80"));
  EXPECT_FALSE(is_prefix(dot, "\xC1"));
  EXPECT_FALSE(is_prefix(dot, "\xED\xA0"));  // D800
  EXPECT_FALSE(is_prefix(dot, "\xF4\x90"));  // past 10FFFF
  EXPECT_FALSE(matches(dot, "a\"b"));
  auto esc = compile_or_die(R"g(root ::= [\]\-\\^a]+)g");
  EXPECT_TRUE(matches(esc, "]-\\^a"));
  EXPECT_FALSE(matches(esc, "b"));
}

TEST(Gbnf, Repetitions) {
  auto g = compile_or_die(R"g(root ::= "a"* "b"+ "c"? "d"{2} "e"{1,} "f"{1,3} "g"{,2})g");
  EXPECT_TRUE(matches(g, "bddef"));
  EXPECT_TRUE(matches(g, "aabbbcddeeefffgg"));
  EXPECT_FALSE(matches(g, "ddef"));      // b+ needs one
  EXPECT_FALSE(matches(g, "bdef"));      // d{2}
  EXPECT_FALSE(matches(g, "bddffff"));   // e{1,}
  EXPECT_FALSE(matches(g, "bddeffff"));  // f{1,3}
  EXPECT_FALSE(matches(g, "bddefggg"));  // g{,2}
  auto group = compile_or_die(R"g(root ::= ("ab" | "c"){2,3})g");
  EXPECT_TRUE(matches(group, "abc"));
  EXPECT_TRUE(matches(group, "cabab"));
  EXPECT_FALSE(matches(group, "c"));
  EXPECT_FALSE(matches(group, "cccc"));
}

TEST(Gbnf, RulesRecursionCommentsAndNewlines) {
  auto g = compile_or_die(R"g(# nested brackets
root ::= item*   # any number
item ::=
    "[" item* "]"
  | "(" item* ")"
expr ::= (
  "x"
  | "y"
)
)g");
  EXPECT_TRUE(matches(g, ""));
  EXPECT_TRUE(matches(g, "[()][[(())]]"));
  EXPECT_FALSE(matches(g, "[(])"));
  EXPECT_TRUE(is_prefix(g, "[[[((("));
  EXPECT_FALSE(matches(g, "[[[((("));
  auto deep = compile_or_die(R"g(root ::= "(" root ")" | "x")g");
  std::string s = std::string(300, '(') + "x" + std::string(300, ')');
  EXPECT_TRUE(matches(deep, s));
  EXPECT_FALSE(matches(deep, s + ")"));
}

TEST(Gbnf, AmbiguousGrammarsKeepEveryParse) {
  auto g = compile_or_die(R"g(root ::= x x "!"
x ::= "a"*)g");
  EXPECT_TRUE(matches(g, "!"));
  EXPECT_TRUE(matches(g, "aaaa!"));
  auto h = compile_or_die(R"g(root ::= ("a" | "ab") ("bc" | "c") | "abd")g");
  EXPECT_TRUE(matches(h, "abc"));
  EXPECT_TRUE(matches(h, "abbc"));
  EXPECT_TRUE(matches(h, "abd"));
  EXPECT_FALSE(matches(h, "ab"));
  auto rec = compile_or_die(R"g(root ::= s
s ::= "a" s "b" | "a" s | "")g");
  EXPECT_TRUE(matches(rec, "aaab"));
  EXPECT_TRUE(matches(rec, "aabb"));
  EXPECT_FALSE(matches(rec, "abb"));
}

TEST(Gbnf, ErrorsNameLineColumnAndProblem) {
  EXPECT_EQ(parse_error("root ::= \"a\"\nfoo ::= bar\n"), "line 2, column 9: rule 'bar' is not defined");
  EXPECT_EQ(parse_error("a ::= \"x\"\n"), "the grammar has no rule named 'root'");
  EXPECT_EQ(parse_error("root ::= \"x\n"), "line 1, column 10: string literal not closed on its line");
  EXPECT_EQ(parse_error("root ::= [a-z\n"), "line 1, column 10: character class not closed on its line");
  EXPECT_EQ(parse_error("root ::= [z-a]"), "line 1, column 12: range end is below its start in the character class");
  EXPECT_EQ(parse_error("root ::= (\"a\""),
            "line 1, column 14: expected ')' to close the '(' at line 1, column 10, found the end of the grammar");
  EXPECT_EQ(parse_error("root := \"a\""), "line 1, column 6: expected '::=' after the rule name 'root'");
  EXPECT_EQ(parse_error("::= \"a\""), "line 1, column 1: expected a rule name, found ':'");
  EXPECT_EQ(parse_error("root ::= \"a\" )"), "line 1, column 14: expected the end of the line, found ')'");
  EXPECT_EQ(parse_error("root ::= \"a\" b ::= \"c\""),
            "line 1, column 14: expected a newline before the definition of rule 'b'");
  EXPECT_EQ(parse_error("root ::= \"\\q\""), "line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(parse_error("root ::= \"\\x4\""), "line 1, column 11: escape '\\x' needs 2 hex digits");
  EXPECT_EQ(parse_error("root ::= \"\\uD800\""), "line 1, column 11: a surrogate code point is not a character");
  EXPECT_EQ(parse_error("root ::= \"\xC3(\""), "line 1, column 11: invalid UTF-8");
  EXPECT_EQ(parse_error("root ::= \"a\"{3,2}"), "line 1, column 13: repetition {3,2} has a maximum below its minimum");
  EXPECT_EQ(parse_error("root ::= \"a\"{x}"), "line 1, column 14: expected ',' or '}' in a repetition, found 'x'");
  EXPECT_EQ(parse_error("root ::= \"a\"{}"), "line 1, column 13: expected a number in '{}'");
  EXPECT_EQ(parse_error("root ::= \"a\"{2"),
            "line 1, column 15: expected ',' or '}' in a repetition, found the end of the grammar");
  EXPECT_EQ(parse_error("root ::= \"a\"{999999}"), "line 1, column 14: repetition count larger than 100000");
  EXPECT_EQ(parse_error("root ::= @"), "line 1, column 10: unexpected '@'");
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\""),
            "line 2, column 1: rule 'root' is defined twice (first at line 1)");
  EXPECT_EQ(parse_error("root ::= root \"a\" | \"b\""),
            "line 1, column 1: rule 'root' is left-recursive (root -> root without consuming input)");
  EXPECT_EQ(parse_error("root ::= x\nx ::= y? root \"a\" | \"b\"\ny ::= \"c\""),
            "line 1, column 1: rule 'root' is left-recursive (root -> x -> root without consuming input)");
  EXPECT_EQ(parse_error("root ::= \"a\" root"),
            "line 1, column 1: rule 'root' can never complete (every alternative recurses or is an empty class)");
  EXPECT_EQ(parse_error("root ::= []"),
            "line 1, column 1: rule 'root' can never complete (every alternative recurses or is an empty class)");
  EXPECT_EQ(parse_error(std::string(200, '(') + std::string(200, ')')).substr(0, 60),
            "line 1, column 1: expected a rule name, found '('");
  EXPECT_EQ(parse_error("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')')),
            "line 1, column 138: parentheses nested more than 128 deep");
}

// Repetitions too large to inline copy by copy call their body's machine once per copy: nested
// ones compile to a few hundred states and still count exactly.
TEST(Gbnf, LargeRepetitionsCallTheirBody) {
  auto g = compile_or_die(R"g(root ::= (("ab" | "c"){50}){2,1000} ".")g");
  ASSERT_TRUE(g);
  EXPECT_LT(g->automaton().n_states, 2000);
  std::string fifty;  // 50 copies: 25 of "ab", 25 of "c"
  for (int i = 0; i < 25; ++i) fifty += "abc";
  std::string body;
  for (int i = 0; i < 1000; ++i) body += fifty;
  EXPECT_TRUE(matches(g, body + "."));
  EXPECT_TRUE(matches(g, fifty + fifty + "."));
  EXPECT_TRUE(matches(g, body.substr(0, fifty.size() * 517) + "."));
  EXPECT_FALSE(matches(g, body + fifty + "."));
  EXPECT_FALSE(matches(g, fifty + "."));
  EXPECT_FALSE(matches(g, fifty + fifty + "c."));
  EXPECT_FALSE(matches(g, fifty + fifty.substr(1) + "."));
  EXPECT_FALSE(is_prefix(g, body + "a"));
  EXPECT_TRUE(is_prefix(g, body.substr(0, 777)));
}

TEST(Gbnf, LimitsAreEnforced) {
  GrammarLimits small;
  small.max_text_bytes = 10;
  EXPECT_EQ(parse_error("root ::= \"abcdef\"", small), "the grammar has 17 bytes, more than the limit 10");
  small = {};
  small.max_rules = 2;
  EXPECT_EQ(parse_error("root ::= a b\na ::= \"x\"\nb ::= \"y\"", small),
            "line 1, column 12: the grammar has more than 2 rules");
  small = {};
  small.max_elements = 1000;
  EXPECT_EQ(parse_error("root ::= \"a\"{2000}", small),
            "the grammar expands to more than 1000 elements (repetitions counted per copy)");
  // Nested repetitions multiply; a single byte class repeated past the limits is refused.
  EXPECT_EQ(parse_error("root ::= [a-z]{100000} [a-z]{100000} [a-z]{100000}"),
            "the grammar needs more than 200000 automaton states");
  small = {};
  small.max_automaton_states = 50;
  EXPECT_EQ(parse_error("root ::= [a-z]{60}", small), "the grammar needs more than 50 automaton states");
}

}  // namespace
}  // namespace afd::serve::test_gbnf
