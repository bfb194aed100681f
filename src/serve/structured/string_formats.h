// GBNF for JSON Schema string formats (the text between the quotes): date, time, date-time
// (RFC 3339: calendar-exact days, leap years included; upper-case 'T' and 'Z'; seconds
// 00-59), uuid (8-4-4-4-12 hex digits, either case), email (a dot-atom local part '@'
// dot-separated domain labels of letters, digits and inner '-', at least two labels).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "serve/structured/gbnf_builder.h"

namespace afd::serve {

// The rule for the format's text (no quotes), or none for a format this file does not know.
std::optional<std::string> string_format_rule(GbnfBuilder& b, std::string_view format);

}  // namespace afd::serve
