// Exact GBNF for JSON numbers within decimal bounds: digit-wise rules over the numbers' text,
// for integers ("0", "-"? [1-9][0-9]*) and for decimals ("-"? int ("." digits)?, no exponent).
// The languages are exact: a text is matched iff it is such a number and its value lies within
// the bounds. Zero is written without '-' ("0", "0.0"): "-0" is valid JSON but never produced.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/structured/gbnf_builder.h"

namespace afd::serve {

// A finite decimal: [-] int_digits [. frac_digits]. Canonical: int_digits without leading zeros
// ("0" for none), frac_digits without trailing zeros, zero never negative.
struct Decimal {
  bool negative = false;
  std::string int_digits = "0";
  std::string frac_digits;
};

// The exact decimal value of a JSON number as written by its shortest round-trip text (0.1 is
// 1/10, not the binary double nearest it). Errors: not a number, non-finite, an exponent whose
// digits would exceed 400.
Result<Decimal> decimal_from_json(const nlohmann::ordered_json& value);
// -1, 0, 1 as a < b, a == b, a > b.
int compare(const Decimal& a, const Decimal& b);
std::string to_string(const Decimal& d);

struct NumberBounds {
  std::optional<Decimal> lo;  // none: unbounded below
  bool lo_exclusive = false;
  std::optional<Decimal> hi;  // none: unbounded above
  bool hi_exclusive = false;
};

// A GBNF expression (its rules added to `b`) matching the integers within bounds, or none when
// no integer is.
std::optional<std::string> integer_range_gbnf(GbnfBuilder& b, const NumberBounds& bounds);
// A GBNF expression matching the decimals (no exponent) within bounds, or none when the bounds
// admit no number.
std::optional<std::string> decimal_range_gbnf(GbnfBuilder& b, const NumberBounds& bounds);

}  // namespace afd::serve
