// Per keyword: texts valid for a schema are accepted by its grammar (byte by byte, through the
// matcher), invalid ones rejected. The GBNF text is not the oracle; acceptance is.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/structured/gbnf_builder.h"
#include "tests/unit/serve/structured/grammar_oracle.h"

namespace afd::serve::test_schema_acceptance {
namespace {

using Json = nlohmann::ordered_json;
using testing::GrammarOracle;

std::string grammar_of(const char* schema) {
  auto r = json_schema_to_gbnf(Json::parse(schema));
  EXPECT_TRUE(r.ok()) << schema << ": " << r.status().message();
  return r.ok() ? *r : "root ::= \"\\x00never\"";
}

void check(const char* schema, const std::vector<std::string>& valid, const std::vector<std::string>& invalid) {
  GrammarOracle g(grammar_of(schema));
  ASSERT_TRUE(g.ok());
  for (const auto& v : valid) EXPECT_TRUE(g.accepts(v)) << schema << "\nshould accept: " << v;
  for (const auto& v : invalid) EXPECT_FALSE(g.accepts(v)) << schema << "\nshould reject: " << v;
}

TEST(SchemaAccepts, Null) { check(R"({"type":"null"})", {"null"}, {"nul", "null ", " null", "0", "\"null\""}); }

TEST(SchemaAccepts, Boolean) { check(R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "truefalse"}); }

TEST(SchemaAccepts, Integer) {
  check(R"({"type":"integer"})", {"0", "7", "-7", "1234567890123456789012"},
        {"01", "-0", "+1", "1.0", "1e3", "-", "", "0x1"});
}

TEST(SchemaAccepts, IntegerBounds) {
  check(R"({"type":"integer","minimum":-15,"maximum":150})", {"-15", "-9", "0", "9", "10", "99", "100", "149", "150"},
        {"-16", "-100", "151", "160", "200", "1000", "1500"});
  check(R"({"type":"integer","exclusiveMinimum":-15,"exclusiveMaximum":150})", {"-14", "149"}, {"-15", "150"});
  check(R"({"type":"integer","minimum":1.5,"maximum":3.5})", {"2", "3"}, {"1", "4"});
  check(R"({"type":"integer","minimum":97})", {"97", "98", "99", "100", "12345678901234567890"}, {"96", "9", "0", "-1"});
  check(R"({"type":"integer","maximum":-3})", {"-3", "-4", "-10", "-123456789012345"}, {"-2", "0", "3", "-1"});
  check(R"({"type":"integer","minimum":-3})", {"-3", "-1", "0", "5", "1000"}, {"-4", "-10"});
  check(R"({"type":"integer","maximum":42})", {"42", "0", "-1000000"}, {"43", "100"});
  check(R"({"type":"integer","minimum":1000,"maximum":1000})", {"1000"}, {"999", "1001", "100"});
}

TEST(SchemaAccepts, Number) {
  check(R"({"type":"number"})", {"0", "-0", "1.5", "-0.25", "1e10", "2.5E-3", "1E+2"},
        {"01", ".5", "1.", "+1", "1e", "--1", "NaN", "Infinity"});
}

TEST(SchemaAccepts, NumberBounds) {
  check(R"({"type":"number","minimum":0.5,"maximum":100.25})",
        {"0.5", "0.50", "0.51", "0.6", "1", "99.999", "100", "100.25", "100.250", "100.2"},
        {"0.49", "0.4999", "0", "-1", "100.26", "100.251", "101", "1000", "0.5e1"});
  check(R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", {"0.5", "0.001", "0.999"},
        {"0", "0.0", "0.000", "1", "1.0", "1.5"});
  check(R"({"type":"number","minimum":-2.5,"maximum":-0.5})", {"-2.5", "-1", "-0.5", "-0.75", "-2.49"},
        {"-2.51", "-3", "-0.4", "0", "0.5"});
  check(R"({"type":"number","minimum":-1,"exclusiveMaximum":0})", {"-1", "-0.5", "-0.0001"}, {"0", "-1.01", "0.1"});
  check(R"({"type":"number","exclusiveMinimum":-0.5})", {"-0.4", "0", "10.5", "123456"}, {"-0.5", "-0.6", "-1"});
}

TEST(SchemaAccepts, StringCharactersAndEscapes) {
  check(R"({"type":"string"})",
        {R"("")", R"("abc")", R"("\" \\ \/ \b \f \n \r \t")", R"("\u00e9\uD83D\uDE00")", "\"é😀\""},
        {"\"a", "abc", "\"\n\"", R"("\x")", R"("\u12")", R"("\uD83D")", R"("\uDE00")", "\"\x01\""});
}

TEST(SchemaAccepts, StringLength) {
  check(R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("abc")", R"("\n\"")", "\"é😀\"",
                                                              R"("\uD83D\uDE00a")"},
        {R"("a")", R"("abcd")", R"("\n")", R"("\uD83D\uDE00")"});
}

TEST(SchemaAccepts, StringEnumAndConst) {
  check(R"({"enum":["red","gr\"een",1,null,[1,{"a":true}]]})",
        {R"("red")", R"("gr\"een")", "1", "null", R"([1,{"a":true}])"}, {R"("blue")", "2", R"("1")", "[1]"});
  check(R"({"const":{"k":[1,2]}})", {R"({"k":[1,2]})"}, {R"({"k":[1]})", "{}"});
  check(R"({"type":"string","enum":["a",1]})", {R"("a")"}, {"1"});
}

TEST(SchemaAccepts, StringPattern) {
  check(R"({"type":"string","pattern":"^[a-z]+-\\d{2,3}$"})", {R"("ab-12")", R"("z-999")"},
        {R"("ab-1")", R"("Ab-12")", R"("ab-1234")", R"("xab-12 ")"});
  // A search: unanchored sides take any text.
  check(R"({"type":"string","pattern":"b+c"})", {R"("bc")", R"("abbcd")", R"("\n\"bc\\")"}, {R"("ac")", R"("cb")"});
  // Characters JSON escapes appear in their canonical escape.
  check(R"({"type":"string","pattern":"^a\"b\\\\c\\n$"})", {R"("a\"b\\c\n")"}, {R"("a\u0022b\\c\n")"});
  check(R"({"type":"string","pattern":"^(x|yz)*$"})", {R"("")", R"("xyzx")"}, {R"("xy")"});
  check(R"({"type":"string","pattern":"^[^a]$"})", {R"("b")", R"("\"")", R"("\n")", R"("\u0001")"}, {R"("a")", R"("")"});
}

TEST(SchemaAccepts, StringFormats) {
  check(R"({"type":"string","format":"date"})", {R"("2024-02-29")", R"("2000-02-29")", R"("2023-12-31")"},
        {R"("2023-02-29")", R"("1900-02-29")", R"("2023-04-31")", R"("2023-13-01")", R"("2023-1-01")"});
  check(R"({"type":"string","format":"time"})", {R"("23:59:59Z")", R"("00:00:00.123+05:30")"},
        {R"("24:00:00Z")", R"("12:00:00")", R"("12:60:00Z")"});
  check(R"({"type":"string","format":"date-time"})", {R"("2024-01-02T03:04:05Z")"}, {R"("2024-01-02 03:04:05Z")"});
  check(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
        {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  check(R"({"type":"string","format":"email"})", {R"("a.b+c@example.co.uk")"},
        {R"("a@b")", R"("@example.com")", R"("a@-b.com")", R"("a b@c.com")"});
  check(R"({"type":"string","format":"hostname"})", {R"("anything")"}, {"1"});  // unknown: an annotation
}

TEST(SchemaAccepts, ObjectPropertiesInOrderWithOptionalSubsets) {
  const char* s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                      "c":{"type":"boolean"}},"required":["b"]})";
  check(s, {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})", R"({"a":1,"b":"x","c":false})",
            "{\n  \"a\": 1,\n  \"b\": \"x\"\n}", R"({ "b" : "x" })"},
        {"{}", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x","d":1})", R"({"b":1})", R"({"b":"x",})",
         R"({"b":"x","b":"y"})", R"({"a":1,"b":"x","c":false,"c":true})"});
  // All optional: the empty object and every ordered subset.
  check(R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"}}})",
        {"{}", R"({"a":null})", R"({"b":null})", R"({"a":null,"b":null})"}, {R"({"b":null,"a":null})", R"({,})"});
}

TEST(SchemaAccepts, AdditionalProperties) {
  const char* extra_int = R"({"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":{"type":"integer"}})";
  check(extra_int, {"{}", R"({"a":"x"})", R"({"a":"x","b":1,"ab":2})", R"({"zz":3})", R"({"":3})"},
        {R"({"b":"x"})", R"({"a":1})", R"({"a":"x","a":2})", R"({"b":1,"a":"x"})"});
  check(R"({"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false})", {R"({"a":"x"})", "{}"},
        {R"({"b":1})"});
  check(R"({"type":"object","properties":{"a":{"type":"string"}}})", {R"({"a":"x"})"}, {R"({"a":"x","b":1})"});
  check(R"({"type":"object"})", {"{}", R"({"x":[1,{"y":null}],"z":"w"})"}, {"[]", R"({"x"})"});
  check(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a","q"]})", {R"({"a":"x","q":[]})"},
        {R"({"a":"x"})"});
}

TEST(SchemaAccepts, Arrays) {
  check(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})", {"[1]", "[1,2]", "[ 1 , 2 , 3 ]"},
        {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]"});
  check(R"({"type":"array","items":{"type":"integer"}})", {"[]", "[1,2,3,4,5,6,7,8,9,10]"}, {"[1 2]"});
  check(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
        {"[]", R"(["a"])", R"(["a",1])"}, {R"(["a",1,2])", R"([1])"});
  check(R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"null"},"minItems":2})",
        {R"(["a",null])", R"(["a",null,null])"}, {R"(["a"])", R"(["a","b"])"});
  check(R"({"type":"array","maxItems":0})", {"[]", "[ ]"}, {"[1]"});
  check(R"({"type":"array","items":[{"type":"integer"}],"additionalItems":false})", {"[1]", "[]"}, {"[1,2]"});
}

// An array of up to 50 objects with a string of up to 200 characters: the repeated item is called,
// not inlined copy by copy, so it compiles; the bounds hold exactly.
TEST(SchemaAccepts, LargeRepetitionsAtTheirBounds) {
  auto str = [](size_t n) { return "\"" + std::string(n, 'x') + "\""; };
  auto items = [](const std::string& item, int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s + "]";
  };
  const std::string x3 = R"({"x":1,"y":"abc"})";
  check(R"({"type":"array","items":{"type":"object","properties":{"x":{"type":"integer"},)"
        R"("y":{"type":"string","minLength":3,"maxLength":200}},"required":["x"]},"minItems":1,"maxItems":50})",
        {items(x3, 1), items(x3, 50), items(R"({"x":-7})", 50), items(R"({"x":1,"y":)" + str(200) + "}", 50)},
        {"[]", items(x3, 51), items(R"({"x":1,"y":)" + str(201) + "}", 2), items(R"({"x":1,"y":"ab"})", 3)});
}

TEST(SchemaAccepts, LongStringsAtTheirBounds) {
  // Characters of several kinds (an escape, a 2-byte and a 4-byte code point) count one each.
  auto str = [](size_t n) {
    std::string s = "\"";
    for (size_t i = 0; i < n; ++i)
      s += i % 97 == 5 ? "\\u00e9" : i % 89 == 7 ? "\xC3\xA9" : i % 83 == 3 ? "\xF0\x9F\x98\x80" : "x";
    return s + "\"";
  };
  auto abc = [&](size_t a, size_t b, size_t c) {
    return "{\"a\":" + str(a) + ",\"b\":" + str(b) + ",\"c\":" + str(c) + "}";
  };
  check(R"({"type":"object","properties":{"a":{"type":"string","maxLength":500},"b":{"type":"string","maxLength":500},)"
        R"("c":{"type":"string","maxLength":500}},"required":["a","b","c"],"additionalProperties":false})",
        {abc(0, 0, 0), abc(500, 500, 500), abc(499, 1, 500)}, {abc(501, 0, 0), abc(0, 0, 501), abc(500, 501, 500)});
  check(R"({"type":"string","minLength":2000})", {str(2000), str(2001), str(4321)}, {str(0), str(1999)});
}

TEST(SchemaAccepts, AnyOfOneOfAndTypeArrays) {
  check(R"({"anyOf":[{"type":"integer","minimum":10},{"type":"string","maxLength":1}]})", {"10", R"("a")"},
        {"9", R"("ab")", "null"});
  check(R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"1"});
  check(R"({"type":["string","null"],"maxLength":2})", {R"("ab")", "null"}, {R"("abc")", "1"});
  check(R"({"allOf":[{"type":"integer"}]})", {"3"}, {"3.5"});
  check(R"({"minimum":5})", {"5", "6.5"}, {"4", "\"x\""});
  check(R"(true)", {"1", R"({"a":[null]})"}, {"", "{"});
}

TEST(SchemaAccepts, RefsAndRecursion) {
  const char* tree = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},
      "$ref":"#/$defs/node"})";
  check(tree, {R"({"v":1})", R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"},
        {R"({"kids":[]})", R"({"v":1,"kids":[{"kids":[]}]})"});
  check(R"({"definitions":{"x":{"type":"null"}},"type":"array","items":{"$ref":"#/definitions/x"}})", {"[null]"},
        {"[1]"});
  check(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"]})",
        {R"({"next":null})", R"({"next":{"next":null}})"}, {R"({"next":{}})"});
}

TEST(SchemaAccepts, WhitespaceIsBounded) {
  GrammarOracle g(grammar_of(R"({"type":"array","items":{"type":"integer"}})"));
  EXPECT_TRUE(g.accepts("[ 1]"));
  EXPECT_TRUE(g.accepts("[\n" + std::string(GbnfBuilder::kMaxIndent, ' ') + "1\n]"));
  EXPECT_FALSE(g.accepts("[\n" + std::string(GbnfBuilder::kMaxIndent + 1, ' ') + "1]"));
  EXPECT_FALSE(g.accepts("[  1]"));
  EXPECT_FALSE(g.accepts("[\n\n1]"));
  EXPECT_FALSE(g.accepts(" [1]"));
}

TEST(JsonObjectGbnf, AcceptsAnyObjectOnly) {
  GrammarOracle g(json_object_gbnf());
  for (const char* v : {"{}", R"({"a":1})", R"({"a":{"b":[1,2.5e3,"x",true,false,null]}})", "{\n  \"k\": []\n}"}) {
    EXPECT_TRUE(g.accepts(v)) << v;
  }
  for (const char* v : {"[]", "1", R"({"a"})", R"({a:1})", R"({"a":1,})", "{}{}"}) EXPECT_FALSE(g.accepts(v)) << v;
}

TEST(RegexGbnf, WholeTextMatches) {
  auto check_regex = [](const char* pattern, std::vector<std::string> yes, std::vector<std::string> no) {
    auto r = regex_to_gbnf(pattern);
    ASSERT_TRUE(r.ok()) << pattern << ": " << r.status().message();
    GrammarOracle g(*r);
    for (const auto& v : yes) EXPECT_TRUE(g.accepts(v)) << pattern << " should accept " << v;
    for (const auto& v : no) EXPECT_FALSE(g.accepts(v)) << pattern << " should reject " << v;
  };
  check_regex(R"(\d{3}-\d{4})", {"555-1234"}, {"555-123", "5551234", "a555-1234"});
  check_regex(R"((cat|dog)s?)", {"cat", "dogs"}, {"cats!", "bird"});
  check_regex(R"([A-Z][a-z]*\.)", {"Hello.", "A."}, {"hello.", "Hello"});
  check_regex(R"(\w+@\w+\.com)", {"me@site.com"}, {"me@site.org"});
  check_regex(R"(a.c)", {"abc", "a\"c", "a😀c"}, {"a\nc", "ac"});
  check_regex(R"([^\d\s]+)", {"abc", "é"}, {"a1", "a b"});
  check_regex(R"(x{2,}?y{0,2})", {"xx", "xxxyy"}, {"x", "xxyyy"});
  check_regex(R"(^(?:a|)b$)", {"ab", "b"}, {"aab"});
  check_regex(R"(\u00e9\x41\t)", {"éA\t"}, {"éA"});
  check_regex(R"([\-\]a-c])", {"-", "]", "b"}, {"d"});
}

TEST(ChoiceGbnf, ExactlyOneChoice) {
  auto r = choice_to_gbnf({"yes", "no", "maybe \"so\""});
  ASSERT_TRUE(r.ok());
  GrammarOracle g(*r);
  EXPECT_TRUE(g.accepts("yes"));
  EXPECT_TRUE(g.accepts("maybe \"so\""));
  EXPECT_FALSE(g.accepts("yesno"));
  EXPECT_FALSE(g.accepts("ye"));
}

}  // namespace
}  // namespace afd::serve::test_schema_acceptance
