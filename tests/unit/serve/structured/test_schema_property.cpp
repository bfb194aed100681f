// Property test: for several schemas, random values valid for the schema (a generator driven by
// the schema) are accepted byte by byte, compact, pretty-printed and ASCII-escaped; perturbed
// texts are rejected whenever they are not JSON or an independent validator (written here from
// JSON Schema's semantics) finds them invalid.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/structured/gbnf_builder.h"
#include "tests/unit/serve/structured/grammar_oracle.h"

namespace afd::serve::test_schema_property {
namespace {

using Json = nlohmann::ordered_json;
using testing::GrammarOracle;

const Json& resolve(const Json& root, const Json& s) {
  if (s.is_object() && s.contains("$ref")) return root.at(Json::json_pointer(s["$ref"].get<std::string>().substr(1)));
  return s;
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_type(const Json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "string") return v.is_string();
  if (t == "array") return v.is_array();
  if (t == "object") return v.is_object();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return false;
}

// JSON Schema validation for the keywords the schemas below use.
bool valid(const Json& root, const Json& schema_in, const Json& v) {
  const Json& s = resolve(root, schema_in);
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("anyOf") || s.contains("oneOf")) {
    const Json& branches = s.contains("anyOf") ? s["anyOf"] : s["oneOf"];
    size_t n = 0;
    for (const auto& b : branches) n += valid(root, b, v);
    return s.contains("anyOf") ? n > 0 : n == 1;
  }
  if (s.contains("type")) {
    bool any = false;
    if (s["type"].is_string()) {
      any = is_type(v, s["type"]);
    } else {
      for (const auto& t : s["type"]) any = any || is_type(v, t);
    }
    if (!any) return false;
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
  if (v.is_number()) {
    double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
  }
  if (v.is_string()) {
    size_t n = code_points(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    size_t p = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i < p) {
        if (!valid(root, s["prefixItems"][i], v[i])) return false;
      } else if (s.contains("items") && !valid(root, s["items"], v[i])) {
        return false;
      }
    }
  }
  if (v.is_object()) {
    static const Json kEmpty = Json::object();
    const Json& props = s.contains("properties") ? s["properties"] : kEmpty;
    if (s.contains("required")) {
      for (const auto& r : s["required"]) {
        if (!v.contains(r.get<std::string>())) return false;
      }
    }
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!valid(root, props[k], x)) return false;
      } else if (s.contains("additionalProperties") && !valid(root, s["additionalProperties"], x)) {
        return false;
      }
    }
  }
  return true;
}

class Generator {
 public:
  Generator(const Json& root, uint64_t seed) : root_(root), rng_(seed) {}

  Json any(int depth) {
    switch (pick(depth > 2 ? 5 : 7)) {
      case 0: return nullptr;
      case 1: return pick(2) == 1;
      case 2: return static_cast<int64_t>(pick(2001)) - 1000;
      case 3: return (static_cast<double>(pick(20001)) - 10000) / 100;
      case 4: return text(0, 6);
      case 5: {
        Json a = Json::array();
        for (int i = pick(4); i > 0; --i) a.push_back(any(depth + 1));
        return a;
      }
      default: {
        Json o = Json::object();
        for (int i = pick(4); i > 0; --i) o[text(1, 4)] = any(depth + 1);
        return o;
      }
    }
  }

  Json value(const Json& schema_in, int depth = 0) {
    const Json& s = resolve(root_, schema_in);
    if (s.is_boolean()) return any(depth);
    if (s.contains("anyOf") || s.contains("oneOf")) {
      const Json& b = s.contains("anyOf") ? s["anyOf"] : s["oneOf"];
      // Deep recursion: prefer the last branch (the schemas put their base case last).
      return value(depth > 4 ? b.back() : b[pick(static_cast<int>(b.size()))], depth + 1);
    }
    if (s.contains("const")) return s["const"];
    if (s.contains("enum")) return s["enum"][pick(static_cast<int>(s["enum"].size()))];
    std::string t = "any";
    if (s.contains("type")) {
      t = s["type"].is_string() ? s["type"].get<std::string>()
                                : s["type"][pick(static_cast<int>(s["type"].size()))].get<std::string>();
    }
    if (t == "null") return nullptr;
    if (t == "boolean") return pick(2) == 1;
    if (t == "integer") {
      int64_t lo = s.contains("minimum") ? static_cast<int64_t>(std::ceil(s["minimum"].get<double>())) : -100000;
      int64_t hi = s.contains("maximum") ? static_cast<int64_t>(std::floor(s["maximum"].get<double>())) : 100000;
      if (s.contains("exclusiveMinimum")) lo = static_cast<int64_t>(std::floor(s["exclusiveMinimum"].get<double>())) + 1;
      if (s.contains("exclusiveMaximum")) hi = static_cast<int64_t>(std::ceil(s["exclusiveMaximum"].get<double>())) - 1;
      return lo + static_cast<int64_t>(pick(static_cast<int>(hi - lo + 1)));
    }
    if (t == "number") {
      // Hundredths within the bounds (never -0.0).
      double lo = s.contains("minimum") ? s["minimum"].get<double>() : -1000;
      double hi = s.contains("maximum") ? s["maximum"].get<double>() : 1000;
      if (s.contains("exclusiveMinimum")) lo = s["exclusiveMinimum"].get<double>() + 0.01;
      if (s.contains("exclusiveMaximum")) hi = s["exclusiveMaximum"].get<double>() - 0.01;
      int64_t a = static_cast<int64_t>(std::ceil(lo * 100 - 1e-9)), b = static_cast<int64_t>(std::floor(hi * 100 + 1e-9));
      int64_t k = a + static_cast<int64_t>(pick(static_cast<int>(b - a + 1)));
      if (k == 0) return 0.0;
      return static_cast<double>(k) / 100;
    }
    if (t == "string") {
      int lo = s.value("minLength", 0), hi = s.value("maxLength", lo + 8);
      return text(lo, hi);
    }
    if (t == "array") {
      size_t lo = s.value("minItems", 0), hi = s.value("maxItems", lo + 3);
      if (depth > 4) hi = lo;
      size_t n = lo + static_cast<size_t>(pick(static_cast<int>(hi - lo + 1)));
      size_t p = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
      if (s.contains("items") && s["items"].is_boolean() && !s["items"].get<bool>()) n = std::min(n, p);
      Json a = Json::array();
      for (size_t i = 0; i < n; ++i) {
        a.push_back(value(i < p ? s["prefixItems"][i] : (s.contains("items") ? s["items"] : Json(true)), depth + 1));
      }
      return a;
    }
    if (t == "object") {
      Json o = Json::object();
      static const Json kEmpty = Json::object();
      const Json& props = s.contains("properties") ? s["properties"] : kEmpty;
      std::vector<std::string> required;
      if (s.contains("required")) required = s["required"].get<std::vector<std::string>>();
      for (const auto& [k, sub] : props.items()) {
        bool req = std::find(required.begin(), required.end(), k) != required.end();
        if (req || pick(2) == 1) o[k] = value(sub, depth + 1);
      }
      bool extras = s.contains("additionalProperties") ? !(s["additionalProperties"].is_boolean() &&
                                                           !s["additionalProperties"].get<bool>())
                                                       : props.empty();
      if (extras) {
        Json extra_schema = s.contains("additionalProperties") ? s["additionalProperties"] : Json(true);
        for (int i = pick(3); i > 0; --i) {
          std::string k = "x" + std::to_string(pick(50));  // extra names are written without escapes
          if (!props.contains(k) && !o.contains(k)) o[k] = value(extra_schema, depth + 1);
        }
      }
      return o;
    }
    return any(depth);
  }

  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  Json text(int lo, int hi) {
    static const std::vector<std::string> kChars = {"a", "b", "z", "0", " ", "\"", "\\", "/", "\n", "\t", "\x01",
                                                    "é", "😀", "{", ":"};
    int n = lo + pick(hi - lo + 1);
    std::string out;
    for (int i = 0; i < n; ++i) out += kChars[pick(static_cast<int>(kChars.size()))];
    return out;
  }

 private:
  const Json& root_;
  std::mt19937_64 rng_;
};

// Text-level and value-level perturbations of a valid value.
std::vector<std::string> perturb(const Json& root, const Json& v, const std::string& text, Generator& gen) {
  std::vector<std::string> out;
  static const std::string kInsert = "0159-.e\",:{}[]a \\";
  for (int i = 0; i < 4 && !text.empty(); ++i) {
    size_t at = static_cast<size_t>(gen.pick(static_cast<int>(text.size())));
    out.push_back(text.substr(0, at) + text.substr(at + 1));                                      // drop
    out.push_back(text.substr(0, at) + kInsert[gen.pick(static_cast<int>(kInsert.size()))] + text.substr(at));  // insert
    std::string r = text;
    r[at] = kInsert[gen.pick(static_cast<int>(kInsert.size()))];  // replace
    out.push_back(r);
  }
  // Value level: walk to a random node and change it.
  for (int i = 0; i < 6; ++i) {
    Json w = v;
    Json* node = &w;
    while (node->is_structured() && !node->empty() && gen.pick(3) != 0) {
      auto it = node->begin();
      std::advance(it, gen.pick(static_cast<int>(node->size())));
      node = &*it;
    }
    switch (gen.pick(6)) {
      case 0:
        if (node->is_number()) *node = node->get<double>() + 1000;
        else if (node->is_string()) *node = node->get<std::string>() + "abcdefghijklmnopqrstuvwxyz";
        else *node = "surprise";
        break;
      case 1:
        if (node->is_number()) *node = -node->get<double>() - 1000.5;
        else if (node->is_string()) *node = "";
        else *node = 7;
        break;
      case 2:
        if (node->is_object()) (*node)["unknown_property"] = 1;
        else if (node->is_array()) node->push_back(node->empty() ? Json(1) : node->back());
        else *node = nullptr;
        break;
      case 3:
        if (node->is_object() && !node->empty()) node->erase(node->begin());
        else if (node->is_array() && !node->empty()) node->erase(node->begin());
        else *node = Json::array();
        break;
      case 4:
        if (node->is_number_integer()) *node = node->get<int64_t>() + 1;
        else if (node->is_number()) *node = node->get<double>() + 0.001;
        else *node = true;
        break;
      default:
        if (node->is_number()) *node = node->get<double>() - 1;
        else *node = Json::object();
        break;
    }
    if (!valid(root, root, w)) out.push_back(w.dump());
  }
  return out;
}

void run_property(const char* schema_text, int n_values, uint64_t seed) {
  Json root = Json::parse(schema_text);
  auto gbnf = json_schema_to_gbnf(root);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  GrammarOracle g(*gbnf);
  ASSERT_TRUE(g.ok());
  Generator gen(root, seed);
  int n_rejected = 0;
  for (int i = 0; i < n_values; ++i) {
    Json v = gen.value(root);
    ASSERT_TRUE(valid(root, root, v)) << "generator bug: " << v.dump();
    for (const std::string& text : {v.dump(), v.dump(2), v.dump(-1, ' ', true)}) {
      ASSERT_TRUE(g.accepts(text)) << schema_text << "\nshould accept: " << text;
    }
    for (const std::string& bad : perturb(root, v, v.dump(), gen)) {
      Json parsed = Json::parse(bad, nullptr, /*allow_exceptions=*/false);
      bool is_json = !parsed.is_discarded();
      if (is_json && valid(root, root, parsed)) continue;  // still valid: the grammar may take it or not
      ++n_rejected;
      EXPECT_FALSE(g.accepts(bad)) << schema_text << "\nshould reject (" << (is_json ? "invalid" : "not JSON")
                                   << "): " << bad;
    }
  }
  EXPECT_GT(n_rejected, n_values);  // the perturbations do produce invalid texts
}

TEST(SchemaProperty, FlatObjectWithBoundsAndOptionals) {
  run_property(R"({"type":"object","properties":{
      "id":{"type":"integer","minimum":-15,"maximum":150},
      "score":{"type":"number","exclusiveMinimum":0,"maximum":99.5},
      "name":{"type":"string","minLength":1,"maxLength":5},
      "tag":{"enum":["a","b\"c",3,null]},
      "nick":{"type":["string","null"],"maxLength":3},
      "ok":{"type":"boolean"}},
    "required":["id","name"],"additionalProperties":false})",
               150, 1);
}

TEST(SchemaProperty, NestedArraysOfObjects) {
  run_property(R"({"type":"object","properties":{
      "items":{"type":"array","minItems":1,"maxItems":4,"items":{"type":"object","properties":{
          "sku":{"type":"string","minLength":2,"maxLength":2},"qty":{"type":"integer","minimum":1}},
        "required":["sku","qty"]}},
      "pair":{"type":"array","prefixItems":[{"type":"integer","maximum":-3},{"type":"string"}],"items":false},
      "note":{"type":"string"}},
    "required":["items","pair"]})",
               100, 2);
}

TEST(SchemaProperty, RecursiveTreeThroughDefs) {
  run_property(R"({"$defs":{"node":{"type":"object","properties":{
        "v":{"type":"number","minimum":-1.5,"exclusiveMaximum":2.25},
        "kids":{"type":"array","maxItems":3,"items":{"$ref":"#/$defs/node"}}},
      "required":["v"],"additionalProperties":false}},
    "anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]})",
               100, 3);
}

TEST(SchemaProperty, AdditionalPropertiesAndAnyValues) {
  run_property(R"({"type":"object","properties":{"fixed":{"const":"yes"},"any":true},
    "additionalProperties":{"type":"integer","minimum":0,"maximum":9}})",
               150, 4);
  run_property(R"({"type":"array","items":{"type":"object"},"maxItems":3})", 100, 5);
}

}  // namespace
}  // namespace afd::serve::test_schema_property
