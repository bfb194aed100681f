// parse_json_bounded: limits, duplicate keys, key order, errors, and linear time on the worst
// shapes a 1 MiB body can take under the default limits.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "serve/api/json_limits.h"

namespace afd::serve::test_json_limits {
namespace {

using json = nlohmann::ordered_json;

std::string nested_arrays(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

double seconds_to_parse(const std::string& text, const JsonLimits& lim, bool* ok) {
  auto t0 = std::chrono::steady_clock::now();
  auto r = parse_json_bounded(text, lim);
  *ok = r.ok();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// An object with n keys "k0".."k{n-1}" whose values are small integers.
std::string wide_object(size_t n) {
  std::string s = "{";
  for (size_t i = 0; i < n; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i % 10);
  return s + "}";
}

void expect_error(const std::string& text, const JsonLimits& lim, const std::string& needle) {
  auto r = parse_json_bounded(text, lim);
  ASSERT_FALSE(r.ok()) << text.substr(0, 200);
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(JsonLimits, ParsesOrdinaryDocuments) {
  auto r = parse_json_bounded(R"({"z":1,"a":[true,null,"s",-3,2.5,18446744073709551615],"m":{"x":{}}})", JsonLimits{});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->dump(), R"({"z":1,"a":[true,null,"s",-3,2.5,18446744073709551615],"m":{"x":{}}})");
  EXPECT_TRUE((*r)["a"][5].is_number_unsigned());
  std::vector<std::string> keys;
  for (auto it = r->begin(); it != r->end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"z", "a", "m"}));
  for (const char* scalar : {"7", "\"x\"", "null", " [ ] ", "{}"})
    EXPECT_TRUE(parse_json_bounded(scalar, JsonLimits{}).ok()) << scalar;
  // Same result as nlohmann's own parser on a document with every kind of value.
  const std::string doc = R"({"b":[1,{"c":[[],{}]},"\u00e9\ud83d\ude00"],"a":-0.0,"d":1e300,"e":{"f":false}})";
  EXPECT_EQ(parse_json_bounded(doc, JsonLimits{})->dump(), json::parse(doc).dump());
}

TEST(JsonLimits, DuplicateKeysKeepFirstPositionAndLastValue) {
  // Few keys (pairwise comparison) and many (sorted) must agree with nlohmann's parse.
  for (const std::string& doc :
       {std::string(R"({"a":1,"b":2,"a":3})"), std::string(R"({"a":1,"a":{"x":1},"b":2,"a":[3]})"),
        std::string(R"({"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k2":20,"k10":10,"k2":[22],"k1":11})")}) {
    auto r = parse_json_bounded(doc, JsonLimits{});
    ASSERT_TRUE(r.ok()) << doc;
    EXPECT_EQ(r->dump(), json::parse(doc).dump()) << doc;
  }
  EXPECT_EQ(parse_json_bounded(R"({"a":1,"b":2,"a":3})", JsonLimits{})->dump(), R"({"a":3,"b":2})");
}

TEST(JsonLimits, DepthLimit) {
  JsonLimits lim;
  EXPECT_TRUE(parse_json_bounded(nested_arrays(64), lim).ok());
  expect_error(nested_arrays(65), lim, "nests deeper than 64 levels (json_max_depth)");
  std::string objs;
  for (int i = 0; i < 65; ++i) objs += "{\"a\":";
  objs += '1';
  objs.append(65, '}');
  expect_error(objs, lim, "json_max_depth");
  // 130k levels: refused at level 65 without touching the rest, and without recursion.
  expect_error(nested_arrays(130000), lim, "json_max_depth");
  expect_error("{\"x\":" + std::string(130000, '['), lim, "json_max_depth");
  lim.max_depth = 3;
  EXPECT_TRUE(parse_json_bounded("[[[1]]]", lim).ok());
  expect_error("[[[[1]]]]", lim, "deeper than 3 levels");
}

TEST(JsonLimits, KeyAndValueLimits) {
  JsonLimits lim;
  EXPECT_TRUE(parse_json_bounded(wide_object(1024), lim).ok());
  expect_error(wide_object(1025), lim, "more than 1024 keys (json_max_object_keys)");
  // Duplicates count: the limit is on keys as written.
  std::string dup = "{";
  for (int i = 0; i < 1025; ++i) dup += (i ? ",\"a\":1" : "\"a\":1");
  expect_error(dup + "}", lim, "json_max_object_keys");
  lim.max_values = 4;
  EXPECT_TRUE(parse_json_bounded("[1,[2]]", lim).ok());
  expect_error("[1,[2,3]]", lim, "more than 4 JSON values (json_max_values)");
  expect_error("[{},{},{},{}]", lim, "json_max_values");
}

TEST(JsonLimits, SyntaxErrorsNameThePlaceNotTheBytes) {
  for (const std::string& bad : {std::string("{not json"), std::string("[1,2"), std::string("{\"a\":1} x"),
                                std::string(""), std::string("[1e999]"), std::string("\"\xff\xfe\""),
                                std::string("{\"a\" 1}"), std::string("[01]")}) {
    auto r = parse_json_bounded(bad, JsonLimits{}, "the body");
    ASSERT_FALSE(r.ok()) << bad;
    const std::string& m = r.status().message();
    EXPECT_EQ(m.rfind("the body is not valid JSON", 0), 0u) << m;
    EXPECT_LE(m.size(), 260u) << m;
    for (char c : m) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << m;  // no raw input bytes echoed
  }
  // A long string with bad UTF-8 at its end is not quoted back.
  auto r = parse_json_bounded("[\"" + std::string(100000, 'a') + "\xc3\"]", JsonLimits{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().find("aaaa"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("line 1"), std::string::npos) << r.status().message();
}

// The time bound is generous (the old ordered_json::parse needed ~5 s for 80k keys, this
// builder a few milliseconds), so a loaded machine cannot make it flaky.
TEST(JsonLimits, ManyKeysAreLinear) {
  JsonLimits lim;
  lim.max_object_keys = 1 << 20;
  const std::string doc = wide_object(80000);
  bool ok = false;
  const double s = seconds_to_parse(doc, lim, &ok);
  EXPECT_TRUE(ok);
  EXPECT_LT(s, 1.0) << "80k keys took " << s << " s";
  auto r = parse_json_bounded(doc, lim);
  ASSERT_EQ(r->size(), 80000u);
  EXPECT_EQ(r->begin().key(), "k0");
  EXPECT_EQ((*r)["k79999"], 9);
  // The same keys all repeated: still linear, and one key each with the last value.
  std::string rep = doc.substr(0, doc.size() - 1) + "," + wide_object(80000).substr(1);
  lim.max_object_keys = 1 << 20;
  const double s2 = seconds_to_parse(rep, lim, &ok);
  EXPECT_TRUE(ok);
  EXPECT_LT(s2, 1.0) << s2;
}

// The worst shapes a 1 MiB body can take under the default limits, each parsed well under a
// second (milliseconds when idle).
TEST(JsonLimits, OneMebibyteWorstShapesParseFast) {
  const size_t kMiB = 1 << 20;
  std::vector<std::pair<std::string, std::string>> shapes;
  {  // The most values: a flat array of zeros.
    std::string s = "[0";
    while (s.size() + 3 < kMiB) s += ",0";
    shapes.emplace_back("flat zeros", s + "]");
  }
  {  // The most containers at the depth limit.
    std::string s = "[";
    const std::string unit = nested_arrays(63);
    while (s.size() + unit.size() + 2 < kMiB) s += (s.size() > 1 ? "," : "") + unit;
    shapes.emplace_back("64-deep arrays", s + "]");
  }
  {  // Objects of 1024 keys nested 64 deep, each the first member of its parent, so every
     // member move or reallocation would touch the big subtree if the builder copied.
    std::string open, close;
    std::string tail;
    for (int i = 1; i < 1024; ++i) tail += ",\"" + std::to_string(i) + "\":0";
    for (int d = 0; d < 63; ++d) {
      open += "{\"0\":";
      close = tail + "}" + close;
    }
    std::string s = open + "\"" + std::string(kMiB - 64 * tail.size() - 2000, 'x') + "\"" + close;
    shapes.emplace_back("deep wide objects", s);
  }
  {  // Objects of 1024 duplicate keys (a sort of equal keys per object).
    std::string obj = "{";
    for (int i = 0; i < 1024; ++i) obj += (i ? ",\"a\":1" : "\"a\":1");
    obj += "}";
    std::string s = "[";
    while (s.size() + obj.size() + 2 < kMiB) s += (s.size() > 1 ? "," : "") + obj;
    shapes.emplace_back("duplicate keys", s + "]");
  }
  {  // Long keys sharing a long prefix (the costliest key comparisons).
    const std::string prefix(900, 'p');
    std::string s = "{";
    for (int i = 0; s.size() + prefix.size() + 20 < kMiB && i < 1024; ++i)
      s += (i ? ",\"" : "\"") + prefix + std::to_string(1023 - i) + "\":0";
    shapes.emplace_back("long shared-prefix keys", s + "}");
  }
  {  // Many tiny objects of 9 keys (the sorting path), each with a duplicate.
    const std::string obj = R"({"a":0,"b":0,"c":0,"d":0,"e":0,"f":0,"g":0,"h":0,"a":1})";
    std::string s = "[";
    while (s.size() + obj.size() + 2 < kMiB) s += (s.size() > 1 ? "," : "") + obj;
    shapes.emplace_back("tiny objects", s + "]");
  }
  for (const auto& [name, text] : shapes) {
    ASSERT_LE(text.size(), kMiB) << name;
    bool ok = false;
    const double s = seconds_to_parse(text, JsonLimits{}, &ok);
    EXPECT_TRUE(ok) << name;
    EXPECT_LT(s, 1.0) << name << " took " << s << " s";
    std::printf("[ timing ] %-24s %7zu bytes: %.1f ms\n", name.c_str(), text.size(), s * 1e3);
  }
}

}  // namespace
}  // namespace afd::serve::test_json_limits
