// The Prometheus text exposition format (version 0.0.4), one sample line at a time: the
// parser shared by what reads /metrics text from outside (serve/metrics/prom_merge.h merges
// workers' scrapes; plan/eplb.h reads expert counts from one). That text is outside input: a
// line that does not follow the format is refused whole, never half read.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace afd {

struct PromLabel {
  std::string_view name;
  std::string_view quoted_value;  // as written: with its quotes and escapes (\\, \", \n)
};

// Views into the parsed line, valid while it is.
struct PromSample {
  std::string_view name;
  std::vector<PromLabel> labels;  // in the order written; no name twice
  std::string_view rest;          // "value [timestamp]" as written, trailing blanks dropped
  double value = 0;               // the value (strtod: also NaN, +Inf, -Inf)
};

// A metric or label name ([a-zA-Z_:][a-zA-Z0-9_:]*) at s[*i], moving *i past it; empty (and
// *i unchanged) if there is none.
std::string_view take_prom_name(std::string_view s, size_t* i);

// Moves *i past the blanks (spaces, tabs) at s[*i]: the separators the format allows.
void skip_prom_blanks(std::string_view s, size_t* i);

// Parses a sample line, `name{label="value",...} value [timestamp]` (blanks allowed between the
// parts, a trailing comma in the label set); not a comment or blank line. False if it does not
// follow the format: no name, a malformed or repeated label, an unknown escape, a value that is
// not a number, a timestamp that is not an integer, anything after the timestamp.
bool parse_prom_sample(std::string_view line, PromSample* out);

// The value of label `name`, unescaped; nullopt if the sample has no such label.
std::optional<std::string> prom_label(const PromSample& s, std::string_view name);

}  // namespace afd
