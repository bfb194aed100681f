// GbnfBuilder: collects the rules of one GBNF grammar (llama.cpp's format) under unique names,
// and compiles JSON Schemas (json_schema.cpp), regexes (regex_gbnf.cpp) and the shared JSON
// rules (any value, any object, string characters, whitespace) into it. Plus the convenience
// wrappers that return a whole grammar.
//
// Shapes every JSON rule follows:
// - A value rule matches the value's text only, no whitespace before or after it; containers
//   put `ws` around their punctuation (`"{" ws member ws "," ws member ws "}"`).
// - `ws` is nothing, one space, or a newline and at most kMaxIndent spaces or tabs (llama.cpp's
//   JSON grammars do the same): compact (`{"a":1}`), Python-style (`{"a": 1}`) and indented
//   output fit, and a model cannot spend its tokens on white space.
// - Strings: any character but '"', '\' and U+0000..U+001F raw; escapes `\" \\ \/ \b \f \n \r
//   \t \uXXXX`, where a \u escape of a surrogate must be a high one followed by a low one.
// - Numbers: JSON's grammar (no leading zeros, no '+', no "-0" for integers).
//
// Limits (each a clean invalid_argument, never deep recursion or unbounded work): kMaxRules
// rules and kMaxGrammarBytes of rule text per grammar; a schema nests at most kMaxSchemaDepth
// subschemas; kMaxProperties properties per object, kMaxEnumValues values per enum,
// kMaxRepetition for any count (minLength, maxItems, regex {m,n}), kMaxNameBytes per
// property name.
//
// Threading: a builder is used by one thread; the free functions are thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace afd::serve {

class GbnfBuilder {
 public:
  static constexpr int kMaxIndent = 32;
  static constexpr size_t kMaxRules = 20000;
  static constexpr size_t kMaxGrammarBytes = size_t{1} << 20;
  static constexpr size_t kMaxNameBytes = 1024;  // a property name
  static constexpr int kMaxSchemaDepth = 32;
  static constexpr size_t kMaxProperties = 1000;
  static constexpr size_t kMaxEnumValues = 1000;
  static constexpr int64_t kMaxRepetition = 10000;

  GbnfBuilder() = default;

  // Adds `name ::= body` under a fresh name made from name_hint (characters outside
  // [a-zA-Z0-9-] become '-', at most 48 kept, "-<n>" appended on a clash); returns the name.
  std::string add_rule(std::string_view name_hint, std::string body);
  // A fresh name whose body is set later with set_rule (for recursive rules).
  std::string reserve_rule(std::string_view name_hint);
  void set_rule(const std::string& name, std::string body);

  // Rules for one JSON value valid against `schema` (json_schema.h states the supported
  // subset); returns the rule name to reference. Errors: invalid_argument naming the keyword
  // and the JSON-pointer path of the subschema, for unsupported keywords, malformed keyword
  // values and unsatisfiable schemas. Objects keep the schema's property order only with
  // ordered_json (nlohmann::json sorts keys).
  Result<std::string> add_schema(const nlohmann::ordered_json& schema, std::string_view name_hint = "value");
  Result<std::string> add_schema(const nlohmann::json& schema, std::string_view name_hint = "value");
  // Any JSON value / any JSON object, shared by every caller of this builder.
  std::string add_any_value();
  std::string add_any_object();
  // Shared leaf rules: `ws`, one JSON string character (any, escapes included), a JSON string.
  std::string ws();
  std::string json_char();
  std::string any_string();
  // A regex (regex_gbnf.h states the subset) as a rule. anchored_both_ends: the text must match
  // the whole regex (guided_regex); otherwise the regex is a search as in JSON Schema's
  // `pattern` (ECMA-262): where it is not anchored by ^ / $, any text may come before / after.
  // in_json_string: the rule matches the characters' JSON string spelling (between the quotes,
  // each character as json_spelling() writes it, other characters raw), else the raw text.
  Result<std::string> add_regex(std::string_view pattern, bool anchored_both_ends, std::string_view name_hint,
                                bool in_json_string = false);

  // Literal text as a GBNF string literal ("..." with '"', '\' and control characters
  // escaped). Precondition: text is valid UTF-8 (invalid bytes are written as U+FFFD).
  static std::string literal(std::string_view text);
  // `atom` repeated lo..hi times (hi none: unbounded) in the shortest form: atom, atom?, atom*,
  // atom+, atom{n}, atom{lo,}, atom{lo,hi}. Precondition: atom is one element (a name, a
  // literal, a class or a parenthesized group), lo <= hi.
  static std::string repeat(const std::string& atom, int64_t lo, std::optional<int64_t> hi);
  // The whole grammar: "root ::= <root_body>\n" followed by every rule added, in order.
  std::string text(std::string_view root_body) const;

  // Whether kMaxRules or kMaxGrammarBytes was passed; add_schema / add_regex then fail.
  bool over_limits() const { return rules_.size() > kMaxRules || n_bytes_ > kMaxGrammarBytes; }
  size_t n_rules() const { return rules_.size(); }

  // A rule shared under a fixed key (e.g. "ws"): added on first use, its name returned after.
  std::string shared_rule(const std::string& key, std::string_view name_hint, const std::string& body);

 private:
  std::string fresh_name(std::string_view hint);

  std::vector<std::pair<std::string, std::string>> rules_;  // name, body (in order added)
  std::unordered_map<std::string, size_t> index_;           // name -> position in rules_
  std::unordered_map<std::string, std::string> shared_;     // key -> name
  size_t n_bytes_ = 0;
};

// Convenience wrappers returning a whole grammar.
// root = one JSON value valid for the schema (nothing before or after it).
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema);
Result<std::string> json_schema_to_gbnf(const nlohmann::json& schema);
// root = any JSON object.
std::string json_object_gbnf();
// root = a text matching the whole regex.
Result<std::string> regex_to_gbnf(std::string_view pattern);
// root = exactly one of the choices' texts. Errors: no choices, a choice not valid UTF-8.
Result<std::string> choice_to_gbnf(const std::vector<std::string>& choices);

}  // namespace afd::serve
