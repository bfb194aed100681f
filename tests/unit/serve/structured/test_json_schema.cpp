#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/structured/gbnf_builder.h"

namespace afd::serve::test_json_schema {
namespace {

using Json = nlohmann::ordered_json;

Status schema_error(const char* schema_text) {
  auto r = json_schema_to_gbnf(Json::parse(schema_text));
  return r.ok() ? Status() : r.status();
}

void expect_refused(const char* schema_text, const std::string& fragment) {
  Status s = schema_error(schema_text);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << schema_text;
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
}

TEST(JsonSchemaErrors, UnsupportedKeywordsAreNamedWithTheirPath) {
  expect_refused(R"({"type":"object","properties":{"x":{"if":{}}}})", "'if' at '#/properties/x'");
  expect_refused(R"({"not":{}})", "'not'");
  expect_refused(R"({"type":"object","patternProperties":{}})", "'patternProperties'");
  expect_refused(R"({"dependentRequired":{}})", "'dependentRequired'");
  expect_refused(R"({"type":"array","uniqueItems":true})", "'uniqueItems'");
  expect_refused(R"({"type":"object","minProperties":1})", "'minProperties'");
  expect_refused(R"({"type":"array","contains":{}})", "'contains'");
  expect_refused(R"({"type":"number","multipleOf":2})", "'multipleOf'");
  expect_refused(R"({"allOf":[{"type":"string"},{"maxLength":3}]})", "'allOf'");
}

TEST(JsonSchemaErrors, MalformedKeywordValuesAreNamed) {
  expect_refused(R"({"type":"object","properties":{"age":{"type":"integer","minimum":"3"}}})",
                 "'minimum' at '#/properties/age' must be a finite number");
  expect_refused(R"({"type":"strin"})", "unknown type");
  expect_refused(R"({"type":"string","maxLength":-1})", "'maxLength'");
  expect_refused(R"({"enum":5})", "'enum'");
  expect_refused(R"({"$ref":"#/$defs/missing"})", "does not resolve");
  expect_refused(R"({"$ref":"http://example.com/s.json"})", "must point into this schema");
  expect_refused(R"([1])", "must be an object or a boolean");
}

TEST(JsonSchemaErrors, UnsatisfiableSchemasAreRefused) {
  expect_refused(R"({"type":"integer","minimum":5,"maximum":4})", "no integer satisfies");
  expect_refused(R"({"type":"integer","minimum":0.2,"maximum":0.8})", "no integer satisfies");
  expect_refused(R"({"type":"number","exclusiveMinimum":1,"maximum":1})", "no number satisfies");
  expect_refused(R"({"type":"string","minLength":3,"maxLength":2})", "'minLength'");
  expect_refused(R"({"type":"array","minItems":3,"maxItems":2})", "'minItems'");
  expect_refused(R"({"type":"array","prefixItems":[{}],"items":false,"minItems":2})", "'minItems'");
  expect_refused(R"({"type":"object","properties":{},"required":["a"],"additionalProperties":false})",
                 "required property 'a'");
  expect_refused(R"({"enum":[]})", "admits no value");
  expect_refused(R"({"type":"string","enum":[1,2]})", "admits no value");
  expect_refused(R"(false)", "is false");
  expect_refused(R"({"anyOf":[false]})", "every branch");
  expect_refused(R"({"$ref":"#"})", "refers only to itself");
}

TEST(JsonSchemaErrors, LargeAndDeepSchemasFailFastWithoutRecursingDeeply) {
  // 10k properties.
  Json props = Json::object();
  for (int i = 0; i < 10000; ++i) props["p" + std::to_string(i)] = Json{{"type", "string"}};
  Json wide = {{"type", "object"}, {"properties", props}};
  auto r = json_schema_to_gbnf(wide);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than the 1000 supported"), std::string::npos) << r.status().message();
  // 5000 levels of nesting (built without recursion; freed by nlohmann iteratively).
  Json deep = {{"type", "string"}};
  for (int i = 0; i < 5000; ++i) deep = Json{{"type", "array"}, {"items", std::move(deep)}};
  r = json_schema_to_gbnf(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nests deeper than 32"), std::string::npos) << r.status().message();
  // Huge enum.
  Json e = Json::array();
  for (int i = 0; i < 5000; ++i) e.push_back(i);
  r = json_schema_to_gbnf(Json{{"enum", e}});
  ASSERT_FALSE(r.ok());
  // Huge counts.
  expect_refused(R"({"type":"string","maxLength":1000000})", "more than the 10000 supported");
}

TEST(JsonSchemaStructure, OptionalPropertiesCostLinearGrammar) {
  // Each member's text appears at most twice, however many optional members there are.
  auto size_for = [](int n) {
    Json props = Json::object();
    for (int i = 0; i < n; ++i) props["p" + std::to_string(i)] = Json{{"type", "boolean"}};
    auto r = json_schema_to_gbnf(Json{{"type", "object"}, {"properties", props}});
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r->size() : 0;
  };
  size_t small = size_for(100), large = size_for(1000);
  EXPECT_LT(large, small * 12) << small << " -> " << large;
}

TEST(JsonSchemaStructure, AcceptedAnnotationsAndRecursiveRefsCompile) {
  auto r = json_schema_to_gbnf(Json::parse(R"({
    "$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x","title":"T","description":"d",
    "strict":true,"examples":[1],"default":{},
    "$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
             "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},
    "$ref":"#/$defs/node"})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rfind("root ::= ", 0), 0u);
  EXPECT_NE(r->find("node ::= "), std::string::npos) << *r;
}

TEST(JsonSchemaStructure, RuleNamesAreSanitizedAndUnique) {
  GbnfBuilder b;
  EXPECT_EQ(b.add_rule("first name", "\"a\""), "first-name");
  EXPECT_EQ(b.add_rule("first name", "\"b\""), "first-name-1");
  EXPECT_EQ(b.add_rule("root", "\"c\""), "root-1");
  EXPECT_EQ(b.add_rule("", "\"d\""), "r");
  EXPECT_EQ(GbnfBuilder::literal("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\x01\"");
}

TEST(ChoiceGbnf, RefusesNoChoicesAndInvalidUtf8) {
  EXPECT_FALSE(choice_to_gbnf({}).ok());
  EXPECT_FALSE(choice_to_gbnf({"ok", std::string("\xff")}).ok());
  auto r = choice_to_gbnf({"yes", "no"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "root ::= \"yes\" | \"no\"\n");
}

}  // namespace
}  // namespace afd::serve::test_json_schema
