// Python value semantics of the Jinja interpreter (jinja_value.h): printing (str, repr,
// json.dumps), truth, equality and ordering over JSON.
#include "serve/text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "serve/text/unicode.h"

namespace afd::serve::jinja {

const json& Value::null_json() {
  static const json kNull;
  return kNull;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]xx
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, 1) + (e > 2 ? sci.substr(2, e - 2) : "");
  int exp = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

// Python's str.isprintable, for repr(): control, separator (other than space), format and
// surrogate code points are escaped. Unassigned and private-use code points are printed.
bool py_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x2064) ||
      (c >= 0x2066 && c <= 0x206f) || c == 0x3000 || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb))
    return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61c || c == 0x6dd || c == 0x70f || c == 0x180e) return false;
  if (c >= 0xd800 && c <= 0xdfff) return false;
  return true;
}

void repr_string(const std::string& s, std::string* out) {
  char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  out->push_back(q);
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    char32_t c = utf8_decode(s, i, &len);
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (!py_printable(c)) {
      char b[16];
      if (c < 0x100) std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(b, sizeof b, "\\U%08x", static_cast<unsigned>(c));
      *out += b;
    } else {
      out->append(s, i, len);
    }
    i += len;
  }
  out->push_back(q);
}

}  // namespace

bool contains_undefined(const json& v) {
  std::vector<const json*> stack{&v};
  while (!stack.empty()) {
    const json* x = stack.back();
    stack.pop_back();
    if (x->is_discarded()) return true;
    if (x->is_structured())
      for (const json& c : *x) stack.push_back(&c);
  }
  return false;
}

bool py_str(const json& v, bool top, size_t limit, std::string* out) {
  if (out->size() > limit) return false;
  if (v.is_discarded()) {
    if (!top) *out += "Undefined";
  } else if (v.is_string()) {
    if (top) *out += v.get_ref<const std::string&>();
    else repr_string(v.get_ref<const std::string&>(), out);
  } else if (v.is_null()) {
    *out += "None";
  } else if (v.is_boolean()) {
    *out += v.get<bool>() ? "True" : "False";
  } else if (v.is_number_float()) {
    *out += py_float(v.get<double>());
  } else if (v.is_number()) {
    *out += v.dump();
  } else if (v.is_array()) {
    out->push_back('[');
    bool first = true;
    for (const json& x : v) {
      if (!first) *out += ", ";
      first = false;
      if (!py_str(x, false, limit, out)) return false;
    }
    out->push_back(']');
  } else if (v.is_object()) {
    out->push_back('{');
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) *out += ", ";
      first = false;
      repr_string(it.key(), out);
      *out += ": ";
      if (!py_str(it.value(), false, limit, out)) return false;
    }
    out->push_back('}');
  }
  return out->size() <= limit;
}

namespace {

void dump_string(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    char esc[16];
    switch (b) {
      case '"': *out += "\\\""; ++i; continue;
      case '\\': *out += "\\\\"; ++i; continue;
      case '\n': *out += "\\n"; ++i; continue;
      case '\r': *out += "\\r"; ++i; continue;
      case '\t': *out += "\\t"; ++i; continue;
      case '\b': *out += "\\b"; ++i; continue;
      case '\f': *out += "\\f"; ++i; continue;
      default: break;
    }
    if (b < 0x20 || (ensure_ascii && b == 0x7f)) {
      std::snprintf(esc, sizeof esc, "\\u%04x", b);
      *out += esc;
      ++i;
      continue;
    }
    if (b < 0x80 || !ensure_ascii) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    size_t len = 1;
    char32_t c = utf8_decode(s, i, &len);
    if (c >= 0x10000) {
      char32_t v = c - 0x10000;
      std::snprintf(esc, sizeof esc, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                    static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
    } else {
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
    }
    *out += esc;
    i += len;
  }
  out->push_back('"');
}

bool dumps_at(const json& v, const DumpOptions& o, int level, size_t limit, std::string* out) {
  if (out->size() > limit) return false;
  auto newline = [&](int l) {
    if (o.indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(o.indent) * static_cast<size_t>(l), ' ');
  };
  if (v.is_object()) {
    if (v.empty()) {
      *out += "{}";
      return true;
    }
    std::vector<json::const_iterator> items;
    for (auto it = v.begin(); it != v.end(); ++it) items.push_back(it);
    if (o.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.key() < b.key(); });
    out->push_back('{');
    bool first = true;
    for (const auto& it : items) {
      if (!first) *out += o.item_sep;
      first = false;
      newline(level + 1);
      dump_string(it.key(), o.ensure_ascii, out);
      *out += o.key_sep;
      if (!dumps_at(it.value(), o, level + 1, limit, out)) return false;
    }
    newline(level);
    out->push_back('}');
  } else if (v.is_array()) {
    if (v.empty()) {
      *out += "[]";
      return true;
    }
    out->push_back('[');
    bool first = true;
    for (const json& x : v) {
      if (!first) *out += o.item_sep;
      first = false;
      newline(level + 1);
      if (!dumps_at(x, o, level + 1, limit, out)) return false;
    }
    newline(level);
    out->push_back(']');
  } else if (v.is_string()) {
    dump_string(v.get_ref<const std::string&>(), o.ensure_ascii, out);
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    *out += std::isfinite(d) ? py_float(d) : (std::isnan(d) ? "NaN" : (d > 0 ? "Infinity" : "-Infinity"));
  } else if (v.is_boolean()) {
    *out += v.get<bool>() ? "true" : "false";
  } else if (v.is_null()) {
    *out += "null";
  } else {
    *out += v.dump();
  }
  return out->size() <= limit;
}

}  // namespace

bool py_dumps(const json& v, const DumpOptions& o, size_t limit, std::string* out) {
  return dumps_at(v, o, 0, limit, out);
}

bool py_truthy(const json& v) {
  if (v.is_null() || v.is_discarded()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.is_number_unsigned() ? v.get<uint64_t>() != 0 : v.get<int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return false;
}

bool py_equal(const json& a, const json& b) {
  if (a.is_discarded() || b.is_discarded()) return a.is_discarded() && b.is_discarded();
  if (numeric(a) && numeric(b)) {
    if (is_float(a) || is_float(b)) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!py_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto f = b.find(it.key());
      if (f == b.end() || !py_equal(it.value(), *f)) return false;
    }
    return true;
  }
  return a == b;
}

bool py_less(const json& a, const json& b, bool* ok) {
  *ok = true;
  if (a.is_discarded() || b.is_discarded()) {
    *ok = false;
    return false;
  }
  if (numeric(a) && numeric(b)) {
    if (is_float(a) || is_float(b)) return as_double(a) < as_double(b);
    return as_int(a) < as_int(b);
  }
  if (a.is_string() && b.is_string()) return a.get_ref<const std::string&>() < b.get_ref<const std::string&>();
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (py_equal(a[i], b[i])) continue;
      return py_less(a[i], b[i], ok);
    }
    return a.size() < b.size();
  }
  *ok = false;
  return false;
}

const char* type_name(const Value& v) {
  if (v.undef()) return "Undefined";
  if (v.method) return "builtin_function_or_method";
  if (v.macro) return "Macro";
  const json& j = v.j();
  if (j.is_null()) return "NoneType";
  if (j.is_boolean()) return "bool";
  if (j.is_number_integer()) return "int";
  if (j.is_number()) return "float";
  if (j.is_string()) return "str";
  if (j.is_array()) return "list";
  return "dict";
}

}  // namespace afd::serve::jinja
