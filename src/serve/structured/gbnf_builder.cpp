#include "serve/structured/gbnf_builder.h"

#include "serve/structured/code_point_set.h"
#include "serve/text/unicode.h"

namespace afd::serve {

std::string GbnfBuilder::fresh_name(std::string_view hint) {
  std::string base;
  for (char c : hint) {
    if (base.size() >= 48) break;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    base += ok ? c : '-';
  }
  if (base.empty()) base = "r";
  std::string name = base;
  for (size_t n = 1; name == "root" || index_.count(name); ++n) name = base + "-" + std::to_string(n);
  return name;
}

std::string GbnfBuilder::reserve_rule(std::string_view name_hint) {
  std::string name = fresh_name(name_hint);
  index_.emplace(name, rules_.size());
  rules_.emplace_back(name, std::string());
  n_bytes_ += name.size() + 6;
  return name;
}

void GbnfBuilder::set_rule(const std::string& name, std::string body) {
  auto& slot = rules_[index_.at(name)].second;
  n_bytes_ += body.size();
  n_bytes_ -= slot.size();
  slot = std::move(body);
}

std::string GbnfBuilder::add_rule(std::string_view name_hint, std::string body) {
  std::string name = reserve_rule(name_hint);
  set_rule(name, std::move(body));
  return name;
}

std::string GbnfBuilder::shared_rule(const std::string& key, std::string_view name_hint, const std::string& body) {
  auto it = shared_.find(key);
  if (it != shared_.end()) return it->second;
  std::string name = add_rule(name_hint, body);
  shared_.emplace(key, name);
  return name;
}

std::string GbnfBuilder::literal(std::string_view text) {
  std::string out = "\"";
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 1;
    char32_t cp = utf8_decode(text, pos, &len);
    if (cp == '"') {
      out += "\\\"";
    } else if (cp == '\\') {
      out += "\\\\";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += gbnf_escape_code_point(cp, "");
    } else {
      utf8_append(&out, cp);
    }
    pos += len;
  }
  return out + "\"";
}

std::string GbnfBuilder::repeat(const std::string& atom, int64_t lo, std::optional<int64_t> hi) {
  if (hi && *hi == lo) return lo == 1 ? atom : atom + "{" + std::to_string(lo) + "}";
  if (!hi) {
    if (lo == 0) return atom + "*";
    if (lo == 1) return atom + "+";
    return atom + "{" + std::to_string(lo) + ",}";
  }
  if (lo == 0 && *hi == 1) return atom + "?";
  return atom + "{" + std::to_string(lo) + "," + std::to_string(*hi) + "}";
}

std::string GbnfBuilder::text(std::string_view root_body) const {
  std::string out = "root ::= ";
  out += root_body;
  out += '\n';
  for (const auto& [name, body] : rules_) {
    out += name;
    out += " ::= ";
    out += body;
    out += '\n';
  }
  return out;
}

std::string GbnfBuilder::ws() {
  return shared_rule("ws", "ws", "( \" \" | \"\\n\" [ \\t]{0," + std::to_string(kMaxIndent) + "} )?");
}

std::string GbnfBuilder::json_char() {
  // \u escapes: a non-surrogate, or a high surrogate followed by a low one.
  std::string hex = "[0-9a-fA-F]";
  std::string u = shared_rule("json-u-escape", "json-u-escape",
                              "[0-9a-cA-Ce-fE-F] " + hex + "{3} | [dD] [0-7] " + hex + "{2} | [dD] [89abAB] " + hex +
                                  "{2} \"\\\\u\" [dD] [c-fC-F] " + hex + "{2}");
  return shared_rule("json-char", "json-char",
                     "[^\\x22\\x5c\\x00-\\x1f] | \"\\\\\" ([\\x22\\x5c/bfnrt] | \"u\" " + u + ")");
}

std::string GbnfBuilder::any_string() {
  std::string c = json_char();
  return shared_rule("json-string", "json-string", "\"\\\"\" " + c + "* \"\\\"\"");
}

std::string GbnfBuilder::add_any_value() {
  auto it = shared_.find("json-value");
  if (it != shared_.end()) return it->second;
  std::string value = reserve_rule("json-value");
  shared_.emplace("json-value", value);
  std::string w = ws();
  std::string str = any_string();
  std::string num = shared_rule("json-number", "json-number",
                                "\"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\x2d]? [0-9]+)?");
  std::string arr = add_rule("json-array", "\"[\" " + w + " (" + value + " (" + w + " \",\" " + w + " " + value +
                                               ")* " + w + ")? \"]\"");
  std::string obj = add_any_object();
  set_rule(value, obj + " | " + arr + " | " + str + " | " + num + " | \"true\" | \"false\" | \"null\"");
  return value;
}

std::string GbnfBuilder::add_any_object() {
  auto it = shared_.find("json-object");
  if (it != shared_.end()) return it->second;
  std::string obj = reserve_rule("json-object");
  shared_.emplace("json-object", obj);
  std::string value = add_any_value();
  std::string w = ws();
  std::string member = add_rule("json-member", any_string() + " " + w + " \":\" " + w + " " + value);
  set_rule(obj, "\"{\" " + w + " (" + member + " (" + w + " \",\" " + w + " " + member + ")* " + w + ")? \"}\"");
  return obj;
}

std::string json_object_gbnf() {
  GbnfBuilder b;
  std::string obj = b.add_any_object();
  return b.text(obj);
}

Result<std::string> regex_to_gbnf(std::string_view pattern) {
  GbnfBuilder b;
  AFD_ASSIGN_OR_RETURN(std::string rule, b.add_regex(pattern, /*anchored_both_ends=*/true, "regex"));
  return b.text(rule);
}

Result<std::string> choice_to_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("'choice' must list at least one choice");
  if (choices.size() > GbnfBuilder::kMaxEnumValues) {
    return invalid_argument("'choice' lists " + std::to_string(choices.size()) + " choices, more than the " +
                            std::to_string(GbnfBuilder::kMaxEnumValues) + " supported");
  }
  std::string body;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (utf8_invalid_offset(choices[i]) != std::string_view::npos) {
      return invalid_argument("'choice[" + std::to_string(i) + "]' is not valid UTF-8");
    }
    if (i) body += " | ";
    body += GbnfBuilder::literal(choices[i]);
  }
  GbnfBuilder b;
  return b.text(body);
}

}  // namespace afd::serve
