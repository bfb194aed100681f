// Reading the fields of a request body (nlohmann::ordered_json, as parse_json_bounded builds it):
// what request.cpp and output_format.cpp share.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace afd::serve {

// The value of b[field], or null when the field is absent or JSON null (both mean "not given").
inline const nlohmann::ordered_json* json_field(const nlohmann::ordered_json& b, const char* field) {
  auto it = b.find(field);
  return it == b.end() || it->is_null() ? nullptr : &*it;
}

// "'field' must be <want>, got <what>": numbers and booleans named by their value, the rest by type.
inline Status json_type_error(const std::string& field, const char* want, const nlohmann::ordered_json& got) {
  const std::string what = got.is_number() || got.is_boolean() ? got.dump() : got.type_name();
  return invalid_argument("'" + field + "' must be " + want + ", got " + what);
}

// A key or value of the request as quoted in a message: at most 64 bytes, cut at a UTF-8
// boundary, "..." when cut.
inline std::string json_excerpt(const std::string& k) {
  if (k.size() <= 64) return k;
  size_t n = 64;
  while (n > 0 && (static_cast<unsigned char>(k[n]) & 0xC0) == 0x80) --n;
  return k.substr(0, n) + "...";
}

}  // namespace afd::serve
