// Bounded JSON parsing for untrusted text (HTTP request bodies): nlohmann's iterative SAX
// parser feeding a builder that enforces a nesting depth, a key count per object and a total
// value count, and builds nlohmann::ordered_json objects in time linear in their size.
//
// Why not ordered_json::parse: its DOM builder inserts each key with ordered_map's linear
// search (quadratic in an object's key count), and it accepts any nesting depth, which later
// recursive copies, comparisons and dumps turn into a stack overflow.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace afd::serve {

struct JsonLimits {
  // Containers nested in each other, the outermost counting 1: `[]` is depth 1, `{"a":[]}` 2.
  int64_t max_depth = 64;
  // Keys written in one object (duplicates included).
  int64_t max_object_keys = 1024;
  // Values of any kind in the whole document, containers included: `[1,[2]]` has 4.
  int64_t max_values = int64_t{1} << 20;
};

// Parses one JSON document (nothing but whitespace may follow it) from untrusted text.
// Time and extra memory are linear in text.size() whatever its shape; the stack does not
// grow with the nesting depth. Duplicate keys: the object keeps the key at the position of
// its first occurrence with the value of its last (nlohmann's own ordered_json::parse
// semantics). Errors are invalid_argument whose message names `what` and the limit, e.g.
// "request body nests deeper than 64 levels (json_max_depth)", or starts "<what> is not valid
// JSON: " and says where the text stops being JSON (no bytes of the input are quoted).
Result<nlohmann::ordered_json> parse_json_bounded(std::string_view text, const JsonLimits& limits,
                                                  std::string_view what = "request body");

}  // namespace afd::serve
