// Regex → GBNF, for guided_regex (regex_to_gbnf: the whole text matches) and JSON Schema's
// `pattern` (GbnfBuilder::add_regex: a search, inside a JSON string). The regex is parsed as
// ECMA-262 with the `u` flag would read it: over Unicode code points.
//
// Supported subset:
// - literals (UTF-8), escaped punctuation (\. \* \\ \/ \- ...), \t \n \r \f \v \0 \xHH \uHHHH
//   \u{H...} \cX;
// - classes \d \w \s (ECMA's sets: ASCII digits, [A-Za-z0-9_], ECMA white space and line
//   terminators) and \D \W \S; `.` (any code point but \n \r U+2028 U+2029);
//   [...] and [^...] with ranges, escapes and the class escapes inside (\b is U+0008 there);
// - groups ( ), (?: ), (?<name> ) (a name without a backreference to it is a plain group);
// - alternation |, quantifiers * + ? {m} {m,} {m,n} with an optional lazy '?' (the same
//   language); a '{' that does not start a quantifier is a literal;
// - ^ only at the start and $ only at the end of a top-level alternative.
// Refused (invalid_argument naming the construct and its offset): backreferences (\1, \k<n>),
// lookahead and lookbehind, word boundaries (\b \B), flags and modifiers ((?i) ...), Unicode
// property escapes (\p{..}), other letter escapes, ^ / $ anywhere else, an empty class [] and
// anything that is not a regex (unbalanced parentheses, a quantifier with nothing to repeat,
// {m,n} with m > n). Limits: kMaxPatternBytes of pattern, groups nested kMaxGroupDepth deep,
// counts up to GbnfBuilder::kMaxRepetition.
//
// Inside a JSON string (in_json_string), each character the regex matches is spelled as
// json_spelling() writes it: '"', '\' and control characters by their one canonical escape,
// every other character raw; unanchored sides match any JSON string text, escapes included.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "core/status.h"
#include "serve/structured/gbnf_builder.h"

namespace afd::serve {

constexpr size_t kMaxPatternBytes = 8192;
constexpr int kMaxGroupDepth = 32;

// The GBNF expression (rules added to b) for texts matching `pattern` per add_regex's
// contract (gbnf_builder.h).
Result<std::string> regex_gbnf(GbnfBuilder& b, std::string_view pattern, bool anchored_both_ends,
                               bool in_json_string);

}  // namespace afd::serve
