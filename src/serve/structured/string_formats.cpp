#include "serve/structured/string_formats.h"

namespace afd::serve {
namespace {

std::string date_rule(GbnfBuilder& b) {
  // Days per month; 02-29 only in leap years (divisible by 4, and by 400 when by 100).
  std::string body =
      "[0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])"
      " | (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\")"
      " | \"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))"
      " | ([0-9]{2} (\"0\" [48] | [2468] [048] | [13579] [26]) | ([02468] [048] | [13579] [26]) \"00\") \"-02-29\"";
  return b.shared_rule("format-date", "format-date", body);
}

std::string time_rule(GbnfBuilder& b) {
  std::string body =
      "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]+)?"
      " (\"Z\" | [+\\x2d] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
  return b.shared_rule("format-time", "format-time", body);
}

}  // namespace

std::optional<std::string> string_format_rule(GbnfBuilder& b, std::string_view format) {
  if (format == "date") return date_rule(b);
  if (format == "time") return time_rule(b);
  if (format == "date-time") {
    std::string d = date_rule(b), t = time_rule(b);
    return b.shared_rule("format-date-time", "format-date-time", d + " \"T\" " + t);
  }
  if (format == "uuid") {
    std::string h = "[0-9a-fA-F]";
    return b.shared_rule("format-uuid", "format-uuid",
                         h + "{8} \"-\" " + h + "{4} \"-\" " + h + "{4} \"-\" " + h + "{4} \"-\" " + h + "{12}");
  }
  if (format == "email") {
    std::string atom = "[a-zA-Z0-9!#$%&'*+/=?\\x5e_`{|}~\\x2d]+";
    std::string label = "[a-zA-Z0-9] ([a-zA-Z0-9\\x2d]{0,61} [a-zA-Z0-9])?";
    return b.shared_rule("format-email", "format-email",
                         atom + " (\".\" " + atom + ")* \"@\" " + label + " (\".\" " + label + ")+");
  }
  return std::nullopt;
}

}  // namespace afd::serve
