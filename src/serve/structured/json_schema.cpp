#include "serve/structured/json_schema.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "serve/structured/code_point_set.h"
#include "serve/structured/number_range.h"
#include "serve/structured/string_formats.h"
#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string, std::less<>> kAnnotations = {
    "title",   "description", "$schema",    "$id",  "$comment",    "default",         "examples",
    "deprecated", "readOnly",  "writeOnly", "strict", "$defs", "definitions", "contentEncoding", "contentMediaType"};
const std::set<std::string, std::less<>> kObjectKeywords = {"properties", "required", "additionalProperties"};
const std::set<std::string, std::less<>> kArrayKeywords = {"items", "prefixItems", "additionalItems", "minItems",
                                                           "maxItems", "uniqueItems"};
const std::set<std::string, std::less<>> kStringKeywords = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string, std::less<>> kNumberKeywords = {"minimum", "maximum", "exclusiveMinimum",
                                                            "exclusiveMaximum"};
const std::set<std::string, std::less<>> kOtherKeywords = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"};
const char* const kTypeNames[] = {"null", "boolean", "integer", "number", "string", "array", "object"};

std::string at(const std::string& path) { return "at '" + path + "'"; }
std::string child(const std::string& path, std::string_view token) {
  std::string escaped;
  for (char c : token) {
    if (c == '~') {
      escaped += "~0";
    } else if (c == '/') {
      escaped += "~1";
    } else {
      escaped += c;
    }
  }
  return path + "/" + escaped;
}

// Depth of a JSON value without recursion (enum and const values are dumped recursively).
size_t value_depth(const Json& v) {
  size_t max_depth = 0;
  std::vector<std::pair<const Json*, size_t>> stack{{&v, 1}};
  while (!stack.empty()) {
    auto [j, d] = stack.back();
    stack.pop_back();
    max_depth = std::max(max_depth, d);
    if (j->is_structured()) {
      for (const auto& e : *j) stack.emplace_back(&e, d + 1);
    }
  }
  return max_depth;
}

// Compact JSON text of a value; nlohmann refuses strings that are not UTF-8.
Result<std::string> dump(const Json& v, const std::string& path) {
  try {
    return v.dump();
  } catch (const nlohmann::json::exception&) {
    return invalid_argument("a value " + at(path) + " holds a string that is not valid UTF-8");
  }
}

std::string repeat(const std::string& atom, int64_t lo, std::optional<int64_t> hi) {
  return GbnfBuilder::repeat(atom, lo, hi);
}

std::string join_alts(const std::vector<std::string>& alts) {
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out;
}

// A trie over code points, for the names extra members may not have.
struct TrieNode {
  bool terminal = false;
  std::map<char32_t, std::unique_ptr<TrieNode>> children;
};

class SchemaCompiler {
 public:
  SchemaCompiler(GbnfBuilder& b, const Json& root) : b_(b), root_(root) {}

  Result<std::string> compile_document(std::string_view name_hint) {
    AFD_ASSIGN_OR_RETURN(std::string rule, compile(root_, "#", 0, name_hint));
    // $ref targets, each compiled once into the rule reserved for it.
    while (!pending_.empty()) {
      auto [pointer, name] = pending_.front();
      pending_.pop_front();
      const Json& target = root_.at(Json::json_pointer(pointer));
      AFD_ASSIGN_OR_RETURN(std::string body, compile_body(target, "#" + pointer, 0, name));
      if (body == name) return invalid_argument("'$ref' '#" + pointer + "' refers only to itself");
      b_.set_rule(name, body);
      AFD_RETURN_IF_ERROR(check_size());
    }
    return rule;
  }

 private:
  Status check_size() const {
    if (b_.over_limits()) {
      return invalid_argument("the schema needs more than " + std::to_string(GbnfBuilder::kMaxRules) +
                              " grammar rules or " + std::to_string(GbnfBuilder::kMaxGrammarBytes) +
                              " bytes of grammar");
    }
    return Status();
  }

  // A rule for one value valid for `s`.
  Result<std::string> compile(const Json& s, const std::string& path, int depth, std::string_view hint) {
    AFD_ASSIGN_OR_RETURN(std::string body, compile_body(s, path, depth, hint));
    // A bare rule name needs no rule of its own.
    if (body.find_first_of(" \"[(|") == std::string::npos) return body;
    // Identical subschemas share one rule (the matcher builds each rule's automaton once).
    auto it = rule_of_body_.find(body);
    if (it != rule_of_body_.end()) return it->second;
    std::string name = b_.add_rule(hint, body);
    rule_of_body_.emplace(std::move(body), name);
    AFD_RETURN_IF_ERROR(check_size());
    return name;
  }

  Result<std::string> compile_body(const Json& s, const std::string& path, int depth, std::string_view hint) {
    if (depth > GbnfBuilder::kMaxSchemaDepth) {
      return invalid_argument("the schema nests deeper than " + std::to_string(GbnfBuilder::kMaxSchemaDepth) +
                              " levels " + at(path));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return b_.add_any_value();
      return invalid_argument("the schema " + at(path) + " is false: no value is valid");
    }
    if (!s.is_object()) return invalid_argument("the schema " + at(path) + " must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key) || kObjectKeywords.count(key) || kArrayKeywords.count(key) ||
          kStringKeywords.count(key) || kNumberKeywords.count(key) || kOtherKeywords.count(key)) {
        continue;
      }
      return invalid_argument("unsupported JSON Schema keyword '" + key + "' " + at(path));
    }
    if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>())) {
      return invalid_argument("unsupported JSON Schema keyword 'uniqueItems' (other than false) " + at(path));
    }
    if (s.contains("$ref")) return compile_ref(s, path);
    if (s.contains("allOf")) return compile_all_of(s, path, depth, hint);
    if (s.contains("anyOf") || s.contains("oneOf")) return compile_any_of(s, path, depth, hint);
    AFD_ASSIGN_OR_RETURN(std::vector<std::string> types, types_of(s, path));
    if (s.contains("enum") || s.contains("const")) return compile_enum(s, path, types);
    std::vector<std::string> alts;
    for (const auto& t : types) {
      Result<std::string> alt = compile_typed(s, t, path, depth, hint);
      if (!alt.ok()) return alt.status();
      alts.push_back(*alt);
    }
    return join_alts(alts);
  }

  // Assertion keywords of `s` other than `except` (annotations never count).
  std::optional<std::string> other_assertion(const Json& s, std::initializer_list<std::string_view> except) {
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key)) continue;
      if (std::find(except.begin(), except.end(), key) != except.end()) continue;
      return key;
    }
    return std::nullopt;
  }

  Result<std::string> compile_ref(const Json& s, const std::string& path) {
    if (auto other = other_assertion(s, {"$ref"})) {
      return invalid_argument("'$ref' " + at(path) + " with the sibling keyword '" + *other + "' is not supported");
    }
    const Json& ref = s["$ref"];
    if (!ref.is_string()) return invalid_argument("'$ref' " + at(path) + " must be a string");
    std::string text = ref.get<std::string>();
    if (text.empty() || text[0] != '#') {
      return invalid_argument("'$ref' " + at(path) + " must point into this schema ('#...'), not '" + text + "'");
    }
    std::string pointer = text.substr(1);
    auto it = refs_.find(pointer);
    if (it != refs_.end()) return it->second;
    bool found = false;
    try {
      found = root_.contains(Json::json_pointer(pointer));
    } catch (const nlohmann::json::exception&) {
      return invalid_argument("'$ref' " + at(path) + ": '" + text + "' is not a JSON pointer");
    }
    if (!found) return invalid_argument("'$ref' " + at(path) + ": '" + text + "' does not resolve in the schema");
    std::string hint = pointer.substr(pointer.rfind('/') + 1);
    std::string name = b_.reserve_rule(hint.empty() ? "ref" : hint);
    refs_.emplace(pointer, name);
    pending_.emplace_back(pointer, name);
    AFD_RETURN_IF_ERROR(check_size());
    return name;
  }

  Result<std::string> compile_all_of(const Json& s, const std::string& path, int depth, std::string_view hint) {
    const Json& all = s["allOf"];
    if (!all.is_array() || all.size() != 1) {
      return invalid_argument("'allOf' " + at(path) + " is supported with exactly one schema");
    }
    if (auto other = other_assertion(s, {"allOf"})) {
      return invalid_argument("'allOf' " + at(path) + " with the sibling keyword '" + *other + "' is not supported");
    }
    return compile(all[0], child(child(path, "allOf"), "0"), depth + 1, hint);
  }

  Result<std::string> compile_any_of(const Json& s, const std::string& path, int depth, std::string_view hint) {
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    if (auto other = other_assertion(s, {key})) {
      return invalid_argument("'" + std::string(key) + "' " + at(path) + " with the sibling keyword '" + *other +
                              "' is not supported");
    }
    const Json& branches = s[key];
    if (!branches.is_array() || branches.empty()) {
      return invalid_argument("'" + std::string(key) + "' " + at(path) + " must be a non-empty array of schemas");
    }
    std::vector<std::string> alts;
    for (size_t i = 0; i < branches.size(); ++i) {
      if (branches[i].is_boolean() && !branches[i].get<bool>()) continue;
      AFD_ASSIGN_OR_RETURN(std::string alt, compile(branches[i], child(child(path, key), std::to_string(i)),
                                                    depth + 1, hint));
      if (std::find(alts.begin(), alts.end(), alt) == alts.end()) alts.push_back(alt);
    }
    if (alts.empty()) return invalid_argument("every branch of '" + std::string(key) + "' " + at(path) + " is false");
    return join_alts(alts);
  }

  // The JSON types to generate: `type`, or inferred from the keywords present.
  Result<std::vector<std::string>> types_of(const Json& s, const std::string& path) {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      std::vector<Json> names;
      if (t.is_string()) {
        names.push_back(t);
      } else if (t.is_array() && !t.empty()) {
        names.assign(t.begin(), t.end());
      } else {
        return invalid_argument("'type' " + at(path) + " must be a type name or a non-empty array of them");
      }
      for (const auto& n : names) {
        bool known = n.is_string() && std::find(std::begin(kTypeNames), std::end(kTypeNames),
                                                n.get<std::string>()) != std::end(kTypeNames);
        if (!known) return invalid_argument("'type' " + at(path) + " names an unknown type " + n.dump());
        if (std::find(types.begin(), types.end(), n.get<std::string>()) == types.end()) {
          types.push_back(n.get<std::string>());
        }
      }
      // Every integer is a number.
      if (std::find(types.begin(), types.end(), "number") != types.end()) {
        types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
      }
      return types;
    }
    if (s.contains("enum") || s.contains("const")) return std::vector<std::string>(std::begin(kTypeNames),
                                                                                std::end(kTypeNames));
    auto has_any = [&](const std::set<std::string, std::less<>>& keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return s.contains(k); });
    };
    if (has_any(kObjectKeywords)) types.push_back("object");
    if (has_any(kArrayKeywords)) types.push_back("array");
    if (has_any(kStringKeywords)) types.push_back("string");
    if (has_any(kNumberKeywords)) types.push_back("number");
    if (types.empty()) types.push_back("any");
    return types;
  }

  static bool has_type(const Json& v, const std::string& type) {
    if (type == "null") return v.is_null();
    if (type == "boolean") return v.is_boolean();
    if (type == "string") return v.is_string();
    if (type == "array") return v.is_array();
    if (type == "object") return v.is_object();
    if (type == "number") return v.is_number();
    if (type == "integer") {
      if (v.is_number_integer()) return true;
      if (!v.is_number_float()) return false;
      auto d = decimal_from_json(v);
      return d.ok() && d->frac_digits.empty();
    }
    return false;
  }

  Result<std::string> compile_enum(const Json& s, const std::string& path, const std::vector<std::string>& types) {
    if (auto other = other_assertion(s, {"enum", "const", "type", "format"})) {
      return invalid_argument("'enum'/'const' " + at(path) + " with the keyword '" + *other + "' is not supported");
    }
    std::vector<const Json*> values;
    if (s.contains("const")) values.push_back(&s["const"]);
    if (s.contains("enum")) {
      const Json& e = s["enum"];
      if (!e.is_array()) return invalid_argument("'enum' " + at(path) + " must be an array");
      if (e.size() > GbnfBuilder::kMaxEnumValues) {
        return invalid_argument("'enum' " + at(path) + " lists " + std::to_string(e.size()) + " values, more than the " +
                                std::to_string(GbnfBuilder::kMaxEnumValues) + " supported");
      }
      for (const auto& v : e) {
        // const and enum together: the const value, if the enum lists it.
        if (s.contains("const") && v != s["const"]) continue;
        if (!s.contains("const")) values.push_back(&v);
      }
      if (s.contains("const") && std::find(e.begin(), e.end(), s["const"]) == e.end()) values.clear();
    }
    std::vector<std::string> alts;
    for (const Json* v : values) {
      if (std::none_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(*v, t); })) continue;
      if (value_depth(*v) > static_cast<size_t>(GbnfBuilder::kMaxSchemaDepth)) {
        return invalid_argument("an 'enum'/'const' value " + at(path) + " nests deeper than " +
                                std::to_string(GbnfBuilder::kMaxSchemaDepth) + " levels");
      }
      AFD_ASSIGN_OR_RETURN(std::string text, dump(*v, path));
      std::string lit = GbnfBuilder::literal(text);
      if (std::find(alts.begin(), alts.end(), lit) == alts.end()) alts.push_back(lit);
    }
    if (alts.empty()) return invalid_argument("'enum'/'const' " + at(path) + " admits no value (of the given 'type')");
    return join_alts(alts);
  }

  Result<std::string> compile_typed(const Json& s, const std::string& type, const std::string& path, int depth,
                                    std::string_view hint) {
    if (type == "any") return b_.add_any_value();
    if (type == "null") return std::string("\"null\"");
    if (type == "boolean") return std::string("\"true\" | \"false\"");
    if (type == "integer" || type == "number") return compile_number(s, type == "integer", path);
    if (type == "string") return compile_string(s, path, hint);
    if (type == "array") return compile_array(s, path, depth, hint);
    return compile_object(s, path, depth, hint);
  }

  Result<std::optional<int64_t>> count_keyword(const Json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::optional<int64_t>();
    const Json& v = s[key];
    bool integral = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0) ||
                    (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() == static_cast<double>(
                                                                        static_cast<int64_t>(v.get<double>())));
    if (!integral) return invalid_argument("'" + std::string(key) + "' " + at(path) + " must be a non-negative integer");
    double d = v.get<double>();
    if (d > static_cast<double>(GbnfBuilder::kMaxRepetition)) {
      return invalid_argument("'" + std::string(key) + "' " + at(path) + " is " + v.dump() + ", more than the " +
                              std::to_string(GbnfBuilder::kMaxRepetition) + " supported");
    }
    return std::optional<int64_t>(static_cast<int64_t>(d));
  }

  Result<std::string> compile_number(const Json& s, bool integer, const std::string& path) {
    NumberBounds bounds;
    auto bound = [&](const char* key, bool lower, bool exclusive) -> Status {
      if (!s.contains(key)) return Status();
      const Json& v = s[key];
      if (v.is_boolean()) {  // draft-04: exclusiveMinimum/Maximum modify minimum/maximum
        if (!exclusive) return invalid_argument("'" + std::string(key) + "' " + at(path) + " must be a number");
        if (v.get<bool>()) (lower ? bounds.lo_exclusive : bounds.hi_exclusive) = true;
        return Status();
      }
      auto d = decimal_from_json(v);
      if (!d.ok()) return invalid_argument("'" + std::string(key) + "' " + at(path) + " must be a finite number");
      auto& slot = lower ? bounds.lo : bounds.hi;
      bool& excl = lower ? bounds.lo_exclusive : bounds.hi_exclusive;
      if (!slot) {
        slot = *d;
        excl = exclusive;
        return Status();
      }
      int c = compare(*d, *slot);
      if (lower ? c > 0 : c < 0) {
        slot = *d;
        excl = exclusive;
      } else if (c == 0) {
        excl = excl || exclusive;
      }
      return Status();
    };
    AFD_RETURN_IF_ERROR(bound("minimum", true, false));
    AFD_RETURN_IF_ERROR(bound("maximum", false, false));
    AFD_RETURN_IF_ERROR(bound("exclusiveMinimum", true, true));
    AFD_RETURN_IF_ERROR(bound("exclusiveMaximum", false, true));
    // A draft-04 boolean exclusive bound without its minimum/maximum bounds nothing.
    if (!bounds.lo) bounds.lo_exclusive = false;
    if (!bounds.hi) bounds.hi_exclusive = false;
    if (!bounds.lo && !bounds.hi) {
      if (integer) return std::string("\"0\" | \"-\"? [1-9] [0-9]*");
      return b_.shared_rule("json-number", "json-number",
                            "\"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\x2d]? [0-9]+)?");
    }
    std::optional<std::string> body = integer ? integer_range_gbnf(b_, bounds) : decimal_range_gbnf(b_, bounds);
    if (!body) {
      return invalid_argument(std::string("no ") + (integer ? "integer" : "number") + " satisfies the bounds " +
                              at(path) + " (" + (bounds.lo ? to_string(*bounds.lo) : "-inf") +
                              (bounds.lo_exclusive ? " < x" : " <= x") + (bounds.hi_exclusive ? " < " : " <= ") +
                              (bounds.hi ? to_string(*bounds.hi) : "inf") + ")");
    }
    return *body;
  }

  Result<std::string> compile_string(const Json& s, const std::string& path, std::string_view hint) {
    AFD_ASSIGN_OR_RETURN(std::optional<int64_t> min_len, count_keyword(s, "minLength", path));
    AFD_ASSIGN_OR_RETURN(std::optional<int64_t> max_len, count_keyword(s, "maxLength", path));
    const std::string quote = "\"\\\"\"";
    bool has_length = min_len || max_len;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return invalid_argument("'pattern' " + at(path) + " must be a string");
      if (has_length || s.contains("format")) {
        return invalid_argument("'pattern' " + at(path) +
                                " combined with 'minLength', 'maxLength' or 'format' is not supported");
      }
      Result<std::string> rule = b_.add_regex(s["pattern"].get<std::string>(), false, std::string(hint) + "-pattern",
                                              /*in_json_string=*/true);
      if (!rule.ok()) return rule.status().with_context("'pattern' " + at(path));
      return quote + " " + *rule + " " + quote;
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) return invalid_argument("'format' " + at(path) + " must be a string");
      std::optional<std::string> rule = string_format_rule(b_, s["format"].get<std::string>());
      if (rule) {
        if (has_length) {
          return invalid_argument("'format' " + at(path) + " combined with 'minLength' or 'maxLength' is not supported");
        }
        return quote + " " + *rule + " " + quote;
      }
    }
    int64_t lo = min_len.value_or(0);
    if (max_len && lo > *max_len) {
      return invalid_argument("'minLength' " + at(path) + " (" + std::to_string(lo) + ") exceeds 'maxLength' (" +
                              std::to_string(*max_len) + ")");
    }
    if (!has_length) return b_.any_string();
    if (max_len && *max_len == 0) return quote + " " + quote;
    return quote + " " + repeat(b_.json_char(), lo, max_len) + " " + quote;
  }

  Result<std::string> compile_array(const Json& s, const std::string& path, int depth, std::string_view hint) {
    AFD_ASSIGN_OR_RETURN(std::optional<int64_t> min_items, count_keyword(s, "minItems", path));
    AFD_ASSIGN_OR_RETURN(std::optional<int64_t> max_items_kw, count_keyword(s, "maxItems", path));
    int64_t min = min_items.value_or(0);
    std::optional<int64_t> max = max_items_kw;
    // Positions 0..p-1 take the prefix schemas, the rest `tail` (none: no more items).
    const Json* prefix = nullptr;
    std::string prefix_key = "prefixItems";
    const Json* tail_schema = nullptr;
    std::string tail_path;
    if (s.contains("prefixItems")) {
      prefix = &s["prefixItems"];
      if (s.contains("items")) tail_schema = &s["items"], tail_path = child(path, "items");
    } else if (s.contains("items") && s["items"].is_array()) {  // draft-07 tuple form
      prefix = &s["items"];
      prefix_key = "items";
      if (s.contains("additionalItems")) tail_schema = &s["additionalItems"], tail_path = child(path, "additionalItems");
    } else if (s.contains("items")) {
      tail_schema = &s["items"], tail_path = child(path, "items");
    }
    if (prefix && (!prefix->is_array() || prefix->size() > GbnfBuilder::kMaxProperties)) {
      return invalid_argument("'" + prefix_key + "' " + at(path) + " must be an array of at most " +
                              std::to_string(GbnfBuilder::kMaxProperties) + " schemas");
    }
    int64_t p = prefix ? static_cast<int64_t>(prefix->size()) : 0;
    std::vector<std::string> prefix_rules;
    for (int64_t i = 0; i < p && (!max || i < *max); ++i) {
      AFD_ASSIGN_OR_RETURN(std::string r, compile((*prefix)[i], child(child(path, prefix_key), std::to_string(i)),
                                                  depth + 1, std::string(hint) + "-" + std::to_string(i)));
      prefix_rules.push_back(r);
    }
    std::optional<std::string> tail;
    if (tail_schema && tail_schema->is_boolean() && !tail_schema->get<bool>()) {
      if (!max || *max > p) max = p;
    } else if (tail_schema) {
      AFD_ASSIGN_OR_RETURN(std::string r, compile(*tail_schema, tail_path, depth + 1, std::string(hint) + "-item"));
      tail = r;
    } else {
      tail = b_.add_any_value();
    }
    if (max && min > *max) {
      return invalid_argument("'minItems' " + at(path) + " (" + std::to_string(min) + ") exceeds the items allowed (" +
                              std::to_string(*max) + ")");
    }
    std::string w = b_.ws();
    std::string sep = w + " \",\" " + w + " ";
    // The elements from position `from` on, `from` of them written already.
    std::string rest;  // for positions >= p
    int64_t from = std::max<int64_t>(p, 0);
    {
      int64_t required = std::max<int64_t>(0, min - from);
      std::optional<int64_t> optional;
      if (max) optional = *max - std::max(min, from);
      if (!tail || (optional && *optional <= 0 && required == 0)) {
        rest = "";
      } else if (from == 0) {
        std::optional<int64_t> more_hi;
        if (max) more_hi = *max - 1;
        if (required >= 1) {
          rest = *tail + (more_hi && *more_hi == 0 ? "" : " " + repeat("(" + sep + *tail + ")", required - 1, more_hi));
        } else {
          rest = "(" + *tail + (more_hi && *more_hi == 0 ? "" : " " + repeat("(" + sep + *tail + ")", 0, more_hi)) + ")?";
        }
      } else {
        std::optional<int64_t> hi;
        if (optional) hi = required + *optional;
        rest = repeat("(" + sep + *tail + ")", required, hi);
      }
    }
    // Prefix positions, last first: piece_i = [sep] el_i piece_{i+1}, optional from minItems on.
    std::string content = rest;
    for (int64_t i = static_cast<int64_t>(prefix_rules.size()) - 1; i >= 0; --i) {
      std::string piece = (i > 0 ? sep : "") + prefix_rules[i] + (content.empty() ? "" : " " + content);
      if (i >= min && i > 0) piece = "(" + piece + ")?";
      content = b_.add_rule(std::string(hint) + "-from-" + std::to_string(i), piece);
    }
    AFD_RETURN_IF_ERROR(check_size());
    if (content.empty()) return "\"[\" " + w + " \"]\"";
    if (min == 0) return "\"[\" " + w + " (" + content + " " + w + ")? \"]\"";
    return "\"[\" " + w + " " + content + " " + w + " \"]\"";
  }

  // Strings (between the quotes) without escapes whose text is not a name in the trie below
  // `node` when prefixed by the node's path.
  std::string name_outside(const TrieNode& node) {
    static const CodePointSet kRaw = CodePointSet::range(0x20, CodePointSet::kMaxCodePoint).minus([] {
      CodePointSet q = CodePointSet::of('"');
      q.add('\\', '\\');
      return q;
    }());
    std::string raw = kRaw.gbnf_class();
    if (node.children.empty()) return raw + "+";  // a leaf is a name: anything longer
    CodePointSet next;
    for (const auto& [cp, c] : node.children) next.add(cp, cp);
    std::vector<std::string> alts;
    CodePointSet other = kRaw.minus(next);
    if (!other.empty()) alts.push_back(other.gbnf_class() + " " + raw + "*");
    for (const auto& [cp, c] : node.children) {
      alts.push_back(CodePointSet::of(cp).gbnf_class() + " " + name_outside(*c));
    }
    std::string body = join_alts(alts);
    std::string rule = b_.add_rule("extra-name", body);
    return node.terminal ? rule : rule + "?";
  }

  Result<std::string> compile_object(const Json& s, const std::string& path, int depth, std::string_view hint) {
    static const Json kEmpty = Json::object();
    const Json& props = s.contains("properties") ? s["properties"] : kEmpty;
    if (!props.is_object()) return invalid_argument("'properties' " + at(path) + " must be an object");
    if (props.size() > GbnfBuilder::kMaxProperties) {
      return invalid_argument("'properties' " + at(path) + " lists " + std::to_string(props.size()) +
                              " properties, more than the " + std::to_string(GbnfBuilder::kMaxProperties) +
                              " supported");
    }
    std::vector<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array() || r.size() > GbnfBuilder::kMaxProperties) {
        return invalid_argument("'required' " + at(path) + " must be an array of at most " +
                                std::to_string(GbnfBuilder::kMaxProperties) + " names");
      }
      for (const auto& n : r) {
        if (!n.is_string()) return invalid_argument("'required' " + at(path) + " must list strings");
        if (n.get_ref<const std::string&>().size() > GbnfBuilder::kMaxNameBytes) {
          return invalid_argument("a 'required' name " + at(path) + " is longer than the " +
                                  std::to_string(GbnfBuilder::kMaxNameBytes) + " bytes supported");
        }
        if (std::find(required.begin(), required.end(), n.get<std::string>()) == required.end()) {
          required.push_back(n.get<std::string>());
        }
      }
    }
    // Extra members: none (false, or absent with properties), any value, or a schema.
    std::optional<std::string> extra_value;
    bool extra_explicitly_false = false;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (a.is_boolean() && !a.get<bool>()) {
        extra_explicitly_false = true;
      } else {
        AFD_ASSIGN_OR_RETURN(std::string r, compile(a, child(path, "additionalProperties"), depth + 1,
                                                    std::string(hint) + "-extra"));
        extra_value = r;
      }
    } else if (props.empty()) {
      extra_value = b_.add_any_value();
    }
    std::string w = b_.ws();
    struct Member {
      std::string kv;
      bool required;
    };
    std::vector<Member> members;
    for (const auto& [name, sub] : props.items()) {
      if (name.size() > GbnfBuilder::kMaxNameBytes) {
        return invalid_argument("a property name " + at(path) + " is longer than the " +
                                std::to_string(GbnfBuilder::kMaxNameBytes) + " bytes supported");
      }
      AFD_ASSIGN_OR_RETURN(std::string value, compile(sub, child(child(path, "properties"), name), depth + 1, name));
      bool req = std::find(required.begin(), required.end(), name) != required.end();
      AFD_ASSIGN_OR_RETURN(std::string key, dump(Json(name), path));
      members.push_back({GbnfBuilder::literal(key) + " " + w + " \":\" " + w + " " + value, req});
    }
    for (const auto& name : required) {
      if (props.contains(name)) continue;
      if (extra_explicitly_false) {
        return invalid_argument("required property '" + name + "' " + at(path) +
                                " is not in 'properties' and 'additionalProperties' is false");
      }
      std::string value = extra_value ? *extra_value : b_.add_any_value();
      AFD_ASSIGN_OR_RETURN(std::string key, dump(Json(name), path));
      members.push_back({GbnfBuilder::literal(key) + " " + w + " \":\" " + w + " " + value, true});
    }
    std::optional<std::string> extra;
    if (extra_value) {
      TrieNode trie;
      auto add_name = [&](const std::string& name) {
        TrieNode* node = &trie;
        for (size_t pos = 0; pos < name.size();) {
          size_t len = 1;
          char32_t cp = utf8_decode(name, pos, &len);
          if (cp < 0x20 || cp == '"' || cp == '\\') return;  // never spelled raw: no extra name can equal it
          auto& next = node->children[cp];
          if (!next) next = std::make_unique<TrieNode>();
          node = next.get();
          pos += len;
        }
        node->terminal = true;
      };
      for (const auto& [name, sub] : props.items()) add_name(name);
      for (const auto& name : required) add_name(name);
      std::string key = trie.children.empty() && !trie.terminal ? b_.any_string()
                                                                  : "\"\\\"\" " + name_outside(trie) + " \"\\\"\"";
      extra = b_.add_rule(std::string(hint) + "-extra-kv", key + " " + w + " \":\" " + w + " " + *extra_value);
    }
    AFD_RETURN_IF_ERROR(check_size());
    // Members in order: each required one, each optional one or not, then extra members.
    // Built from the left so that each member's rule appears at most twice whatever the
    // number of optional members (rules are inlined by the matcher's automaton):
    //   upto_j = upto_{j-1} (sep kv_j)? | kv_j     while no member before j is required
    //   upto_j = upto_{j-1} sep kv_j | kv_j        for the first required member
    //   upto_j = upto_{j-1} (sep kv_j)?  / sep kv_j   after it (a flat sequence)
    std::string sep = w + " \",\" " + w + " ";
    std::string upto;  // members written so far (at least one); "" before the first
    bool may_be_empty = true;
    for (const auto& m : members) {
      std::string item = "(" + sep + m.kv + ")";
      if (upto.empty()) {
        upto = m.kv;
      } else if (may_be_empty) {
        upto = b_.add_rule(std::string(hint) + "-upto", upto + " " + (m.required ? item : item + "?") + " | " + m.kv);
      } else {
        upto += " " + (m.required ? item : item + "?");
      }
      if (m.required) may_be_empty = false;
    }
    std::string content = upto;
    if (extra) {
      std::string more = "(" + sep + *extra + ")*";
      if (upto.empty()) {
        content = *extra + " " + more;
      } else if (may_be_empty) {
        content = "(" + upto + " | " + *extra + ") " + more;
      } else {
        content = "(" + upto + ") " + more;
      }
    }
    AFD_RETURN_IF_ERROR(check_size());
    if (content.empty()) return "\"{\" " + w + " \"}\"";
    content = b_.add_rule(std::string(hint) + "-members", content);
    if (may_be_empty) return "\"{\" " + w + " (" + content + " " + w + ")? \"}\"";
    return "\"{\" " + w + " " + content + " " + w + " \"}\"";
  }

  GbnfBuilder& b_;
  const Json& root_;
  std::unordered_map<std::string, std::string> refs_;      // JSON pointer -> rule
  std::deque<std::pair<std::string, std::string>> pending_;  // refs reserved, not compiled yet
  std::unordered_map<std::string, std::string> rule_of_body_;  // rules made by compile(), by body
};

}  // namespace

Result<std::string> compile_json_schema(GbnfBuilder& b, const nlohmann::ordered_json& schema,
                                        std::string_view name_hint) {
  SchemaCompiler compiler(b, schema);
  return compiler.compile_document(name_hint);
}

Result<std::string> GbnfBuilder::add_schema(const nlohmann::ordered_json& schema, std::string_view name_hint) {
  return compile_json_schema(*this, schema, name_hint);
}

Result<std::string> GbnfBuilder::add_schema(const nlohmann::json& schema, std::string_view name_hint) {
  return compile_json_schema(*this, nlohmann::ordered_json(schema), name_hint);
}

Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  GbnfBuilder b;
  AFD_ASSIGN_OR_RETURN(std::string rule, b.add_schema(schema));
  return b.text(rule);
}

Result<std::string> json_schema_to_gbnf(const nlohmann::json& schema) {
  return json_schema_to_gbnf(nlohmann::ordered_json(schema));
}

}  // namespace afd::serve
