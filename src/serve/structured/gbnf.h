// GBNF (llama.cpp's grammar format) text -> Grammar (grammar.h).
//
// Syntax: rules `name ::= alternatives`, one per line (a rule continues on the next line after
// `::=` or `|`, when the next line starts with `|`, and anywhere inside parentheses); `root` is the
// start rule. Alternatives `a | b` (an alternative may be empty), sequences `a b`, groups `( )`,
// literals "..." and character classes [a-z0-9_] / negated [^"\\] over Unicode code points (written
// as UTF-8), `.` any code point, repetitions `* + ? {m} {m,} {m,n} {,n}`, `#` comments to the end of
// the line, rule names [a-zA-Z0-9_-]+. Escapes in literals and classes: \n \r \t \\ \" \[ \] \- \^
// \xHH \uHHHH \UHHHHHHHH (each names a code point). Rules may be recursive; left recursion is
// refused.
#pragma once

#include <memory>
#include <string_view>

#include "core/status.h"
#include "serve/structured/grammar.h"

namespace afd::serve {

// Errors: invalid_argument "line L, column C: <problem>" (syntax, undefined rule, left recursion,
// a rule that can never complete, a rule defined twice), or naming the limit exceeded.
Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text, const GrammarLimits& limits = {});

}  // namespace afd::serve
