#include "serve/structured/number_range.h"

#include <cmath>
#include <string_view>
#include <vector>

namespace afd::serve {
namespace {

constexpr size_t kMaxDigits = 400;
// Nested digit-wise expressions become a rule every kRuleEvery digits, so that the grammar's
// parenthesis nesting stays small whatever the bounds' length.
constexpr size_t kRuleEvery = 8;

bool all_of(std::string_view s, char c) { return s.find_first_not_of(c) == std::string_view::npos; }

// Canonical unsigned digit strings.
int cmp_uint(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a < b ? -1 : (a > b ? 1 : 0);
}
std::string inc(std::string s) {
  size_t i = s.size();
  while (i > 0 && s[i - 1] == '9') s[--i] = '0';
  if (i == 0) return "1" + s;
  ++s[i - 1];
  return s;
}
std::string dec(std::string s) {  // precondition: s > 0
  size_t i = s.size();
  while (s[i - 1] == '0') s[--i] = '9';
  --s[i - 1];
  if (s.size() > 1 && s[0] == '0') s.erase(0, 1);
  return s;
}

std::string quote(std::string_view digits) { return "\"" + std::string(digits) + "\""; }
std::string any_digits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return "[0-9]{" + std::to_string(n) + "}";
}
std::string digit_class(char lo, char hi) {
  if (lo == hi) return quote(std::string(1, lo));
  return std::string("[") + lo + "-" + hi + "]";
}
std::string seq(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}
std::string join(const std::vector<std::string>& alts) {
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out;
}
// Alternatives as one element usable inside a sequence: parenthesized, or a rule of its own.
std::string atom(GbnfBuilder& b, const std::vector<std::string>& alts, bool as_rule) {
  if (as_rule) return b.add_rule("num", join(alts));
  if (alts.size() == 1 && alts[0].find(' ') == std::string::npos) return alts[0];
  return "(" + join(alts) + ")";
}

// Fixed-length digit strings (leading zeros allowed) >= s / <= s.
std::string ge_fixed(GbnfBuilder& b, std::string_view s) {
  size_t n = s.size();
  if (all_of(s, '0')) return any_digits(n);
  if (n == 1) return digit_class(s[0], '9');
  std::vector<std::string> alts{seq(quote(s.substr(0, 1)), ge_fixed(b, s.substr(1)))};
  if (s[0] < '9') alts.push_back(seq(digit_class(static_cast<char>(s[0] + 1), '9'), any_digits(n - 1)));
  return atom(b, alts, n % kRuleEvery == 0);
}
std::string le_fixed(GbnfBuilder& b, std::string_view s) {
  size_t n = s.size();
  if (all_of(s, '9')) return any_digits(n);
  if (n == 1) return digit_class('0', s[0]);
  std::vector<std::string> alts;
  if (s[0] > '0') alts.push_back(seq(digit_class('0', static_cast<char>(s[0] - 1)), any_digits(n - 1)));
  alts.push_back(seq(quote(s.substr(0, 1)), le_fixed(b, s.substr(1))));
  return atom(b, alts, n % kRuleEvery == 0);
}

// Equal-length digit strings a <= x <= b (a <= b).
std::string same_length_range(GbnfBuilder& b, const std::string& lo, const std::string& hi) {
  size_t n = lo.size();
  size_t i = 0;
  while (i < n && lo[i] == hi[i]) ++i;
  if (i == n) return quote(lo);
  std::string prefix = i ? quote(std::string_view(lo).substr(0, i)) : "";
  size_t rest = n - i - 1;
  std::string_view lo_rest = std::string_view(lo).substr(i + 1), hi_rest = std::string_view(hi).substr(i + 1);
  if (all_of(lo_rest, '0') && all_of(hi_rest, '9')) return seq(prefix, seq(digit_class(lo[i], hi[i]), any_digits(rest)));
  std::vector<std::string> alts{seq(quote(std::string(1, lo[i])), ge_fixed(b, lo_rest))};
  if (hi[i] - lo[i] >= 2) {
    alts.push_back(seq(digit_class(static_cast<char>(lo[i] + 1), static_cast<char>(hi[i] - 1)), any_digits(rest)));
  }
  alts.push_back(seq(quote(std::string(1, hi[i])), le_fixed(b, hi_rest)));
  return seq(prefix, atom(b, alts, false));
}

// Canonical unsigned integers (no leading zeros) in [lo, hi] / >= lo; lo <= hi.
std::vector<std::string> uint_range(GbnfBuilder& b, const std::string& lo, const std::string& hi) {
  if (lo.size() == hi.size()) return {same_length_range(b, lo, hi)};
  std::vector<std::string> alts{same_length_range(b, lo, std::string(lo.size(), '9'))};
  if (hi.size() >= lo.size() + 2) {  // every length strictly between
    alts.push_back("[1-9] [0-9]{" + std::to_string(lo.size()) + "," + std::to_string(hi.size() - 2) + "}");
  }
  alts.push_back(same_length_range(b, "1" + std::string(hi.size() - 1, '0'), hi));
  return alts;
}
std::vector<std::string> uint_at_least(GbnfBuilder& b, const std::string& lo) {
  return {same_length_range(b, lo, std::string(lo.size(), '9')),
          "[1-9] [0-9]{" + std::to_string(lo.size()) + ",}"};
}

// Signed integers as Decimals without fraction.
Decimal floor_of(const Decimal& d) {
  Decimal out{d.negative, d.int_digits, ""};
  if (!d.frac_digits.empty() && d.negative) out.int_digits = inc(d.int_digits);
  return out;
}
Decimal ceil_of(const Decimal& d) {
  Decimal out{d.negative, d.int_digits, ""};
  if (!d.frac_digits.empty() && !d.negative) out.int_digits = inc(d.int_digits);
  if (out.int_digits == "0") out.negative = false;
  return out;
}
Decimal plus_one(Decimal d) {
  if (!d.negative) {
    d.int_digits = inc(d.int_digits);
  } else {
    d.int_digits = dec(d.int_digits);
    if (d.int_digits == "0") d.negative = false;
  }
  return d;
}
Decimal minus_one(Decimal d) {
  if (d.negative || d.int_digits == "0") {
    d.int_digits = d.negative ? inc(d.int_digits) : "1";
    d.negative = true;
  } else {
    d.int_digits = dec(d.int_digits);
  }
  return d;
}

// Digit strings D (possibly empty) with lo < or <= 0.D < or <= hi; hi none: no upper bound.
struct FracSet {
  bool has_empty = false;
  std::optional<std::string> nonempty;  // GBNF for the non-empty members, none when there are none
  bool is_empty() const { return !has_empty && !nonempty; }
};

std::string trim_zeros(std::string_view s) {
  size_t end = s.find_last_not_of('0');
  return end == std::string_view::npos ? "" : std::string(s.substr(0, end + 1));
}

// `digit` followed by a member of `rest`, or none when rest is empty.
std::optional<std::string> prepend(char digit, const FracSet& rest) {
  if (rest.is_empty()) return std::nullopt;
  std::string d = quote(std::string(1, digit));
  if (!rest.nonempty) return d;
  bool simple = rest.nonempty->find(' ') == std::string::npos;
  std::string inner = simple ? *rest.nonempty : "(" + *rest.nonempty + ")";
  return d + " " + inner + (rest.has_empty ? "?" : "");
}

FracSet frac_set(GbnfBuilder& b, std::string_view lo_in, bool lo_excl, const std::optional<std::string>& hi_in,
                 bool hi_excl) {
  std::string lo = trim_zeros(lo_in);
  std::optional<std::string> hi;
  if (hi_in) hi = trim_zeros(*hi_in);
  if (lo.empty() && !hi) {
    if (!lo_excl) return {true, "[0-9]+"};
    return {false, "[0]* [1-9] [0-9]*"};
  }
  if (hi && hi->empty()) {  // upper bound 0
    if (!lo.empty() || lo_excl || hi_excl) return {};
    return {true, "[0]+"};
  }
  FracSet out;
  out.has_empty = lo.empty() && !lo_excl;  // 0.<empty> = 0 <= hi, hi > 0 here
  char f = lo.empty() ? '0' : lo[0];
  std::string lo_rest = lo.empty() ? "" : lo.substr(1);
  std::vector<std::string> alts;
  // First digits strictly between the bounds' first digits: any continuation.
  char free_lo = static_cast<char>(f + 1), free_hi = hi ? static_cast<char>((*hi)[0] - 1) : '9';
  if (free_lo <= free_hi) alts.push_back(digit_class(free_lo, free_hi) + " [0-9]*");
  if (hi && (*hi)[0] == f) {
    if (auto a = prepend(f, frac_set(b, lo_rest, lo_excl, hi->substr(1), hi_excl))) alts.push_back(*a);
  } else {
    if (!hi || (*hi)[0] > f) {
      if (auto a = prepend(f, frac_set(b, lo_rest, lo_excl, std::nullopt, false))) alts.push_back(*a);
    }
    if (hi && (*hi)[0] > f) {
      if (auto a = prepend((*hi)[0], frac_set(b, "", false, hi->substr(1), hi_excl))) alts.push_back(*a);
    }
  }
  if (!alts.empty()) {
    size_t depth = std::max(lo.size(), hi ? hi->size() : 0);
    out.nonempty = depth % kRuleEvery == 0 ? b.add_rule("frac", join(alts)) : join(alts);
  }
  return out;
}

// `int_part` followed by the fraction set, or none when the set is empty.
std::optional<std::string> with_fraction(const std::string& int_part, const FracSet& f) {
  if (f.is_empty()) return std::nullopt;
  if (!f.nonempty) return int_part;
  std::string frac = "\".\" (" + *f.nonempty + ")";
  return int_part + " " + (f.has_empty ? "(" + frac + ")?" : frac);
}

// Non-negative decimals m with lo <(=) m <(=) hi, as "int ("." digits)?".
std::vector<std::string> magnitude_range(GbnfBuilder& b, const Decimal& lo, bool lo_excl,
                                         const std::optional<Decimal>& hi, bool hi_excl) {
  std::vector<std::string> alts;
  auto push = [&](std::optional<std::string> a) {
    if (a) alts.push_back(*a);
  };
  const std::string any_fraction = "(\".\" [0-9]+)?";
  if (hi && cmp_uint(lo.int_digits, hi->int_digits) > 0) return alts;
  if (hi && lo.int_digits == hi->int_digits) {
    push(with_fraction(quote(lo.int_digits), frac_set(b, lo.frac_digits, lo_excl, hi->frac_digits, hi_excl)));
    return alts;
  }
  push(with_fraction(quote(lo.int_digits), frac_set(b, lo.frac_digits, lo_excl, std::nullopt, false)));
  std::string next = inc(lo.int_digits);
  if (!hi) {
    alts.push_back("(" + join(uint_at_least(b, next)) + ") " + any_fraction);
    return alts;
  }
  if (cmp_uint(next, hi->int_digits) < 0) {
    alts.push_back("(" + join(uint_range(b, next, dec(hi->int_digits))) + ") " + any_fraction);
  }
  push(with_fraction(quote(hi->int_digits), frac_set(b, "", false, hi->frac_digits, hi_excl)));
  return alts;
}

Decimal magnitude(const Decimal& d) { return {false, d.int_digits, d.frac_digits}; }
bool is_zero(const Decimal& d) { return d.int_digits == "0" && d.frac_digits.empty(); }

}  // namespace

Result<Decimal> decimal_from_json(const nlohmann::ordered_json& value) {
  if (!value.is_number()) return invalid_argument("not a number");
  if (value.is_number_float() && !std::isfinite(value.get<double>())) return invalid_argument("not a finite number");
  std::string text = value.dump();  // shortest round-trip form for doubles, e.g. "1e-05", "0.1", "100.0"
  Decimal d;
  size_t pos = 0;
  if (text[pos] == '-') d.negative = true, ++pos;
  std::string digits;
  int64_t point = -1;
  for (; pos < text.size() && text[pos] != 'e' && text[pos] != 'E'; ++pos) {
    if (text[pos] == '.') {
      point = static_cast<int64_t>(digits.size());
    } else {
      digits += text[pos];
    }
  }
  if (point < 0) point = static_cast<int64_t>(digits.size());
  if (pos < text.size()) {
    int64_t exp = std::stoll(text.substr(pos + 1));
    if (exp > static_cast<int64_t>(kMaxDigits) || exp < -static_cast<int64_t>(kMaxDigits)) {
      return invalid_argument("a number with more than " + std::to_string(kMaxDigits) + " digits");
    }
    point += exp;
  }
  // digits with the decimal point after `point` digits (point may be < 0 or > size).
  if (point <= 0) {
    d.int_digits = "0";
    d.frac_digits = std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (point >= static_cast<int64_t>(digits.size())) {
    d.int_digits = digits + std::string(static_cast<size_t>(point) - digits.size(), '0');
  } else {
    d.int_digits = digits.substr(0, static_cast<size_t>(point));
    d.frac_digits = digits.substr(static_cast<size_t>(point));
  }
  size_t nz = d.int_digits.find_first_not_of('0');
  d.int_digits = nz == std::string::npos ? "0" : d.int_digits.substr(nz);
  d.frac_digits = trim_zeros(d.frac_digits);
  if (is_zero(d)) d.negative = false;
  return d;
}

int compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  int c = cmp_uint(a.int_digits, b.int_digits);
  if (c == 0) {
    size_t n = std::max(a.frac_digits.size(), b.frac_digits.size());
    std::string fa = a.frac_digits + std::string(n - a.frac_digits.size(), '0');
    std::string fb = b.frac_digits + std::string(n - b.frac_digits.size(), '0');
    c = fa < fb ? -1 : (fa > fb ? 1 : 0);
  }
  return a.negative ? -c : c;
}

std::string to_string(const Decimal& d) {
  return (d.negative ? "-" : "") + d.int_digits + (d.frac_digits.empty() ? "" : "." + d.frac_digits);
}

std::optional<std::string> integer_range_gbnf(GbnfBuilder& b, const NumberBounds& bounds) {
  std::optional<Decimal> lo, hi;
  if (bounds.lo) lo = bounds.lo_exclusive ? plus_one(floor_of(*bounds.lo)) : ceil_of(*bounds.lo);
  if (bounds.hi) hi = bounds.hi_exclusive ? minus_one(ceil_of(*bounds.hi)) : floor_of(*bounds.hi);
  if (lo && hi && compare(*lo, *hi) > 0) return std::nullopt;
  std::vector<std::string> alts;
  // Non-negative part: [max(lo, 0), hi].
  if (!hi || !hi->negative) {
    std::string from = lo && !lo->negative ? lo->int_digits : "0";
    auto part = hi ? uint_range(b, from, hi->int_digits) : uint_at_least(b, from);
    alts.insert(alts.end(), part.begin(), part.end());
  }
  // Negative part: magnitudes [max(1, -hi), -lo].
  if (!lo || lo->negative) {
    std::string from = hi && hi->negative ? hi->int_digits : "1";
    auto part = lo ? uint_range(b, from, lo->int_digits) : uint_at_least(b, from);
    alts.push_back("\"-\" (" + join(part) + ")");
  }
  return "(" + join(alts) + ")";
}

std::optional<std::string> decimal_range_gbnf(GbnfBuilder& b, const NumberBounds& bounds) {
  const auto& lo = bounds.lo;
  const auto& hi = bounds.hi;
  if (lo && hi) {
    int c = compare(*lo, *hi);
    if (c > 0 || (c == 0 && (bounds.lo_exclusive || bounds.hi_exclusive))) return std::nullopt;
  }
  std::vector<std::string> alts;
  // Non-negative part, zero included: [max(lo, 0), hi].
  bool hi_admits_nonnegative = !hi || (!hi->negative && !(is_zero(*hi) && bounds.hi_exclusive));
  if (hi_admits_nonnegative) {
    bool lo_nonnegative = lo && !lo->negative;
    Decimal from = lo_nonnegative ? *lo : Decimal{};
    auto part = magnitude_range(b, from, lo_nonnegative && bounds.lo_exclusive, hi, bounds.hi_exclusive);
    alts.insert(alts.end(), part.begin(), part.end());
  }
  // Negative part, zero excluded: magnitudes in (max(0, -hi) or [-hi, -lo].
  if (!lo || lo->negative) {
    bool hi_negative = hi && hi->negative;
    Decimal from = hi_negative ? magnitude(*hi) : Decimal{};
    bool from_excl = hi_negative ? bounds.hi_exclusive : true;
    std::optional<Decimal> to;
    if (lo) to = magnitude(*lo);
    auto part = magnitude_range(b, from, from_excl, to, bounds.lo_exclusive);
    if (!part.empty()) alts.push_back("\"-\" (" + join(part) + ")");
  }
  if (alts.empty()) return std::nullopt;
  return "(" + join(alts) + ")";
}

}  // namespace afd::serve
