// Evaluator for the Jinja subset, following jinja2 as transformers configures it (an
// ImmutableSandboxedEnvironment with Undefined, trim_blocks, lstrip_blocks, loopcontrols,
// and its own tojson / raise_exception / strftime_now).
//
// Scoping follows Jinja: each for-loop iteration and each macro call gets its own scope;
// `set` writes to the innermost scope; `set ns.attr` updates the namespace object where
// `ns` lives; a macro body sees its parameters and the template's top-level variables,
// not its caller's locals.
//
// Bounds (jinja.h Limits): every statement, expression, loop iteration and item handled
// by a builtin costs a step; every string or value built is charged to the allocation
// budget before it is built where its size is known, or while it grows; statements,
// expressions and macro calls being evaluated count towards the evaluation depth; values
// built by the template may not nest deeper than max_data_depth. Recursion over data
// (printing, json, equality) is therefore bounded by max_data_depth.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include <locale.h>
#include <wctype.h>

#include "serve/text/jinja.h"
#include "serve/text/jinja_ast.h"
#include "serve/text/jinja_value.h"
#include "serve/text/unicode.h"

namespace afd::serve::jinja {

// ---------------------------------------------------------------------------------------
// Python value semantics (jinja_value.h)

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

bool py_isspace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

size_t utf8_offset(std::string_view s, size_t index) {
  size_t i = 0;
  for (size_t n = 0; n < index && i < s.size(); ++n) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  }
  return i;
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

bool py_dumps(const json& v, const DumpOptions& o, size_t limit, std::string* out) { return dumps_at(v, o, 0, limit, out); }

bool py_truthy(const json& v) {
  if (v.is_null() || v.is_discarded()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.is_number_unsigned() ? v.get<uint64_t>() != 0 : v.get<int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return false;
}

namespace {

bool numeric(const json& v) { return v.is_number() || v.is_boolean(); }
bool is_float(const json& v) { return v.is_number_float(); }
__int128 as_int(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  if (v.is_number_unsigned()) return static_cast<__int128>(v.get<uint64_t>());
  return v.get<int64_t>();
}
double as_double(const json& v) { return is_float(v) ? v.get<double>() : static_cast<double>(as_int(v)); }

}  // namespace

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

// ---------------------------------------------------------------------------------------
// Evaluator

namespace {

enum class Flow { normal, brk, cont };

// Arguments of a call, filter or test, bound the way Python binds them: get(i, name)
// is the i-th positional argument or else the keyword argument `name`.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, const char* name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

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

// Unicode case mapping: glibc's simple mappings from the built-in C.UTF-8 locale (Python
// uses the full mappings, which differ for a few characters such as ß -> SS), ASCII only
// where that locale is missing.
locale_t utf8_ctype() {
  static const locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  return l;
}
char32_t cp_upper(char32_t c) {
  if (c < 0x80) return static_cast<char32_t>(std::toupper(static_cast<int>(c)));
  return utf8_ctype() ? static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), utf8_ctype())) : c;
}
char32_t cp_lower(char32_t c) {
  if (c < 0x80) return static_cast<char32_t>(std::tolower(static_cast<int>(c)));
  return utf8_ctype() ? static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), utf8_ctype())) : c;
}
bool cp_is_upper(char32_t c) {
  if (c < 0x80) return std::isupper(static_cast<int>(c)) != 0;
  return utf8_ctype() && iswupper_l(static_cast<wint_t>(c), utf8_ctype());
}
bool cp_is_lower(char32_t c) {
  if (c < 0x80) return std::islower(static_cast<int>(c)) != 0;
  return utf8_ctype() && iswlower_l(static_cast<wint_t>(c), utf8_ctype());
}
bool cp_is_cased(char32_t c) { return cp_is_upper(c) || cp_is_lower(c); }

enum class CaseMode { upper, lower, capitalize, title_py, title_jinja };

// str.upper/lower/capitalize/title, and jinja2's title filter (words start after
// whitespace, '-', '(', '{', '[' or '<').
std::string map_case(const std::string& s, CaseMode mode) {
  std::string r;
  r.reserve(s.size());
  bool prev_cased = false, word_start = true, first = true;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    char32_t c = utf8_decode(s, i, &len);
    char32_t m = c;
    switch (mode) {
      case CaseMode::upper: m = cp_upper(c); break;
      case CaseMode::lower: m = cp_lower(c); break;
      case CaseMode::capitalize: m = first ? cp_upper(c) : cp_lower(c); break;
      case CaseMode::title_py:
        m = prev_cased ? cp_lower(c) : cp_upper(c);
        prev_cased = cp_is_cased(c);
        break;
      case CaseMode::title_jinja: {
        bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        m = sep ? c : (word_start ? cp_upper(c) : cp_lower(c));
        word_start = sep;
        break;
      }
    }
    first = false;
    if (m == c) r.append(s, i, len);
    else utf8_append(&r, m);
    i += len;
  }
  return r;
}
std::string lower_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Code points of s as byte ranges.
std::vector<std::string_view> code_points(const std::string& s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    utf8_decode(s, i, &len);
    out.emplace_back(s.data() + i, len);
    i += len;
  }
  return out;
}

// Python's str.strip family: chars == nullptr strips whitespace, else any code point of *chars.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  auto drop = [&](char32_t c) {
    if (!chars) return py_isspace(c);
    for (size_t i = 0; i < chars->size();) {
      size_t len = 1;
      if (utf8_decode(*chars, i, &len) == c) return true;
      i += len;
    }
    return false;
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e) {
      size_t len = 1;
      if (!drop(utf8_decode(s, b, &len))) break;
      b += len;
    }
  if (right)
    while (e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      size_t len = 1;
      if (!drop(utf8_decode(s, k, &len))) break;
      e = k;
    }
  return s.substr(b, e - b);
}

// Python's str.splitlines() boundaries: \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029.
std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    char32_t c = utf8_decode(s, i, &len);
    bool nl = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
              c == 0x2028 || c == 0x2029;
    if (!nl) {
      i += len;
      continue;
    }
    out.push_back(s.substr(start, i - start));
    i += len;
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    start = i;
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

// Number of line boundaries py_splitlines finds (at most s.size()).
size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    char32_t c = utf8_decode(s, i, &len);
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
        c == 0x2028 || c == 0x2029)
      ++n;
    i += len;
  }
  return n;
}

// Python's int(str): optional whitespace and sign, digits with single underscores between.
bool parse_py_int(const std::string& text, int64_t* out) {
  std::string t = py_strip(text, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  if (i >= t.size()) return false;
  __int128 v = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    if (t[i] == '_' && prev_digit && i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i + 1]))) {
      prev_digit = false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(t[i]))) return false;
    v = v * 10 + (t[i] - '0');
    if (v > static_cast<__int128>(INT64_MAX) + 1) return false;
    prev_digit = true;
  }
  v = neg ? -v : v;
  if (v > INT64_MAX) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

// Python's float(str): whitespace, sign, decimal or exponent forms, inf/nan, underscores.
bool parse_py_float(const std::string& text, double* out) {
  std::string t = py_strip(text, nullptr, true, true);
  std::string c;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_') {
      if (i == 0 || i + 1 >= t.size() || !std::isdigit(static_cast<unsigned char>(t[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[i + 1])))
        return false;
      continue;
    }
    c.push_back(t[i]);
  }
  if (c.empty()) return false;
  std::string l = lower_ascii(c);
  std::string body = (l[0] == '+' || l[0] == '-') ? l.substr(1) : l;
  if (body == "inf" || body == "infinity" || body == "nan") {
    double v = body == "nan" ? NAN : INFINITY;
    *out = l[0] == '-' ? -v : v;
    return true;
  }
  for (char ch : body)
    if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == '.' || ch == 'e' || ch == '+' || ch == '-')) return false;
  char* end = nullptr;
  *out = std::strtod(c.c_str(), &end);
  return end && *end == '\0' && end != c.c_str();
}

// The state of one for loop, read through `loop.*` without building a loop object.
struct LoopState {
  int64_t index0 = 0, length = 0;
  const std::vector<Value>* items = nullptr;
};

struct Scope {
  std::unordered_map<std::string, Value> vars;
  const LoopState* loop = nullptr;  // a for-loop body's scope: `loop`
  // A macro call's scope: lookups continue in the scope where the macro was defined
  // (jinja2 scopes macros lexically), not in the caller's.
  bool macro_frame = false;
  size_t parent = 0;
};

class Evaluator {
 public:
  Evaluator(const json& ctx, const Limits& lim)
      : lim_(lim), true_(Value::of(json(true))), false_(Value::of(json(false))) {
    scopes_.emplace_back();
    for (auto it = ctx.begin(); it != ctx.end(); ++it) scopes_[0].vars[it.key()] = Value::borrow(it.value());
  }

  // The context's nesting (request data) must be within max_data_depth.
  Status check_context(const json& ctx) {
    std::vector<std::pair<const json*, int>> stack{{&ctx, 0}};
    while (!stack.empty()) {
      auto [v, d] = stack.back();
      stack.pop_back();
      if (d > lim_.max_data_depth)
        return limit_error(0, "the messages, tools or other context data are nested deeper than", "max_data_depth",
                           lim_.max_data_depth);
      if (v->is_structured())
        for (const json& c : *v) stack.push_back({&c, d + 1});
    }
    return Status::ok();
  }

  Result<Flow> exec_list(const NodeList& nodes, std::string* out) {
    for (const auto& n : nodes) {
      AFD_ASSIGN_OR_RETURN(Flow f, exec(*n, out));
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  // ---- errors and budgets -------------------------------------------------------------
  static Status error(int line, const std::string& m) {
    return invalid_argument(line > 0 ? "chat template line " + std::to_string(line) + ": " + m : "chat template: " + m);
  }
  static Status limit_error(int line, const std::string& what, const char* name, int64_t value) {
    return error(line, what + " " + std::to_string(value) + " (limit " + name + ")");
  }
  Status step(int line, int64_t n = 1) {
    steps_ += n;
    if (steps_ > lim_.max_steps)
      return limit_error(line, "rendering took more statements, expressions, loop iterations and items than",
                         "max_steps", lim_.max_steps);
    return Status::ok();
  }
  // Charges `bytes` about to be built to the allocation budget.
  Status alloc(int line, size_t bytes) {
    alloc_ += bytes;
    if (alloc_ > lim_.max_alloc_bytes)
      return limit_error(line, "rendering built more bytes of strings and values than", "max_alloc_bytes",
                         static_cast<int64_t>(lim_.max_alloc_bytes));
    return Status::ok();
  }
  // A string of `bytes` is about to be built.
  Status string_size(int line, size_t bytes) {
    if (bytes > lim_.max_output_bytes)
      return limit_error(line, "a string would be longer than", "max_output_bytes",
                         static_cast<int64_t>(lim_.max_output_bytes));
    return alloc(line, bytes);
  }
  // Scanning `bytes` of a string (search, split, compare) costs steps.
  Status scan(int line, size_t bytes) { return step(line, 1 + static_cast<int64_t>(bytes / 64)); }
  Result<Value> str_value(int line, std::string s) {
    AFD_RETURN_IF_ERROR(string_size(line, s.size()));
    return Value::of(json(std::move(s)));
  }
  // A copy of `v` is about to become part of a new value `extra_depth` levels down:
  // checks the resulting depth and charges the copy.
  Status admit(int line, const json& v, int extra_depth) {
    std::vector<std::pair<const json*, int>> stack{{&v, extra_depth}};
    size_t bytes = 0;
    while (!stack.empty()) {
      auto [x, d] = stack.back();
      stack.pop_back();
      if (d > lim_.max_data_depth)
        return limit_error(line, "a value would be nested deeper than", "max_data_depth", lim_.max_data_depth);
      bytes += 64;
      if (x->is_string()) bytes += x->get_ref<const std::string&>().size();
      if (x->is_structured())
        for (const json& c : *x) stack.push_back({&c, d + 1});
    }
    AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(bytes / 1024)));
    return alloc(line, bytes);
  }
  // The JSON of `v` for embedding into a new value: moved when `v` is its sole owner.
  Result<json> take(int line, Value v, int extra_depth) {
    if (v.method) return error(line, std::string("a method (") + v.method + ") cannot be stored in a list or dict");
    if (v.macro) return error(line, "a macro cannot be stored in a list or dict");
    if (v.undef()) return json(json::value_t::discarded);
    AFD_RETURN_IF_ERROR(admit(line, v.j(), extra_depth));
    if (v.p.use_count() == 1) return std::move(*v.p);
    return v.j();
  }
  // Writable JSON of *v, copied first when anything else shares it.
  Result<json*> mutable_json(int line, Value* v) {
    if (v->p.use_count() != 1) {
      AFD_RETURN_IF_ERROR(admit(line, v->j(), 0));
      v->p = std::make_shared<json>(v->j());
    }
    return v->p.get();
  }

  class Depth {
   public:
    explicit Depth(int* d) : d_(d) { ++*d_; }
    ~Depth() { --*d_; }

   private:
    int* d_;
  };
  Status depth_ok(int line) const {
    if (depth_ > lim_.max_eval_depth)
      return limit_error(line, "evaluation nested deeper than", "max_eval_depth", lim_.max_eval_depth);
    return Status::ok();
  }

  Status undefined_error(int line, const Value& v) const {
    return error(line, v.name ? "'" + *v.name + "' is undefined" : std::string("a value is undefined"));
  }

  // Appends str(v) to *out within max_output_bytes.
  Status append_str(int line, const Value& v, std::string* out) {
    if (v.undef()) return Status::ok();
    if (v.method) {  // Python adds the object's address, which no other engine can match
      *out += std::string("<built-in method ") + v.method + " of " + type_name(Value{v.p}) + " object>";
      return Status::ok();
    }
    if (v.macro) {
      *out += "<Macro '" + v.macro->targets[0] + "'>";
      return Status::ok();
    }
    size_t before = out->size();
    if (!py_str(v.j(), true, lim_.max_output_bytes, out))
      return limit_error(line, "the output or a string would be longer than", "max_output_bytes",
                         static_cast<int64_t>(lim_.max_output_bytes));
    return alloc(line, out->size() - before);
  }
  Result<std::string> to_str(int line, const Value& v) {
    std::string s;
    AFD_RETURN_IF_ERROR(append_str(line, v, &s));
    return s;
  }

  // ---- statements ---------------------------------------------------------------------
  // The variable `name` and the index of the scope that holds it.
  const Value* lookup(const std::string& name, size_t* where = nullptr) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      auto f = scopes_[i].vars.find(name);
      if (f != scopes_[i].vars.end()) {
        if (where) *where = i;
        return &f->second;
      }
      if (scopes_[i].macro_frame) i = scopes_[i].parent + 1;  // continue where the macro was defined
    }
    return nullptr;
  }
  Value* lookup_mut(const std::string& name) { return const_cast<Value*>(lookup(name)); }
  // The innermost for loop's state, unless a variable named `loop` hides it.
  const LoopState* find_loop() const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      if (scopes_[i].vars.count("loop")) return nullptr;
      if (scopes_[i].loop) return scopes_[i].loop;
      if (scopes_[i].macro_frame) i = scopes_[i].parent + 1;
    }
    return nullptr;
  }
  Value truth(bool b) const { return b ? true_ : false_; }

  [[gnu::noinline]] Result<Value> loop_attr(int line, const LoopState& L, const std::string& name) {
    const int64_t i = L.index0, n = L.length;
    if (name == "index") return Value::of(json(i + 1));
    if (name == "index0") return Value::of(json(i));
    if (name == "revindex") return Value::of(json(n - i));
    if (name == "revindex0") return Value::of(json(n - i - 1));
    if (name == "first") return truth(i == 0);
    if (name == "last") return truth(i == n - 1);
    if (name == "length") return Value::of(json(n));
    if (name == "depth") return Value::of(json(1));
    if (name == "depth0") return Value::of(json(0));
    if (name == "previtem") return i > 0 ? (*L.items)[static_cast<size_t>(i - 1)] : Value::undefined(&name);
    if (name == "nextitem") return i + 1 < n ? (*L.items)[static_cast<size_t>(i + 1)] : Value::undefined(&name);
    (void)line;
    return Value::undefined(&name);
  }
  // `loop` used as a value ({{ loop }}, set l = loop): a dict of its attributes.
  [[gnu::noinline]] Result<Value> loop_value(int line, const LoopState& L) {
    json o = json::object();
    for (const char* k : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                          "previtem", "nextitem"}) {
      AFD_ASSIGN_OR_RETURN(Value v, loop_attr(line, L, k));
      if (v.undef()) continue;
      AFD_RETURN_IF_ERROR(admit(line, v.j(), 1));
      o[k] = v.j();
    }
    return Value::of(std::move(o));
  }

  Result<Flow> exec(const Node& n, std::string* out) {
    Depth d(&depth_);
    AFD_RETURN_IF_ERROR(depth_ok(n.line));
    AFD_RETURN_IF_ERROR(step(n.line));
    switch (n.kind) {
      case Node::text:
        if (out->size() + n.content.size() > lim_.max_output_bytes)
          return limit_error(n.line, "the output or a string would be longer than", "max_output_bytes",
                             static_cast<int64_t>(lim_.max_output_bytes));
        AFD_RETURN_IF_ERROR(alloc(n.line, n.content.size()));
        *out += n.content;
        return Flow::normal;
      case Node::output: {
        AFD_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        AFD_RETURN_IF_ERROR(append_str(n.line, v, out));
        return Flow::normal;
      }
      case Node::if_:
        for (const auto& [cond, body] : n.branches) {
          bool take_branch = true;
          if (cond) {
            AFD_ASSIGN_OR_RETURN(Value c, eval(*cond));
            take_branch = truthy(c);
          }
          if (take_branch) return exec_list(body, out);
        }
        return Flow::normal;
      case Node::for_:
        return exec_for(n, out);
      case Node::set: {
        AFD_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        AFD_RETURN_IF_ERROR(assign(n, std::move(v)));
        return Flow::normal;
      }
      case Node::set_block: {
        std::string s;
        AFD_ASSIGN_OR_RETURN(Flow f, exec_list(n.body, &s));
        (void)f;
        AFD_RETURN_IF_ERROR(assign(n, Value::of(json(std::move(s)))));
        return Flow::normal;
      }
      case Node::macro:
        scopes_.back().vars[n.targets[0]] = macro_value(n);
        return Flow::normal;
      case Node::break_:
        return Flow::brk;
      case Node::continue_:
        return Flow::cont;
      case Node::passthrough:
        return exec_list(n.body, out);
    }
    return Flow::normal;
  }

  [[gnu::noinline]] Status assign(const Node& n, Value v) {
    if (n.targets.size() == 1) {
      scopes_.back().vars[n.targets[0]] = std::move(v);
      return Status::ok();
    }
    Value* ns = lookup_mut(n.targets[0]);
    if (!ns || !ns->j().is_object())
      return error(n.line, "cannot assign attribute on " + std::string(ns ? type_name(*ns) : "an undefined value") +
                               " '" + n.targets[0] + "'");
    AFD_ASSIGN_OR_RETURN(json x, take(n.line, std::move(v), 1));
    AFD_ASSIGN_OR_RETURN(json * obj, mutable_json(n.line, ns));
    (*obj)[n.targets[1]] = std::move(x);
    return Status::ok();
  }

  // Items a for loop visits: parts of a list, a dict's keys, a string's characters.
  Result<std::vector<Value>> iterate(int line, const Value& seq) {
    std::vector<Value> items;
    if (seq.undef()) return items;
    const json& j = seq.j();
    if (j.is_array()) {
      AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(j.size())));
      items.reserve(j.size());
      for (const json& x : j) items.push_back(seq.part(x));
    } else if (j.is_object()) {
      AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(j.size())));
      for (auto it = j.begin(); it != j.end(); ++it) {
        AFD_RETURN_IF_ERROR(alloc(line, 64 + it.key().size()));
        items.push_back(Value::of(json(it.key())));
      }
    } else if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(s.size())));
      AFD_RETURN_IF_ERROR(alloc(line, 64 * s.size()));
      for (std::string_view c : code_points(s)) items.push_back(Value::of(json(std::string(c))));
    } else {
      return error(line, "'" + std::string(type_name(seq)) + "' object is not iterable");
    }
    return items;
  }

  Status bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back().vars[n.targets[0]] = item;
      return Status::ok();
    }
    AFD_ASSIGN_OR_RETURN(std::vector<Value> parts, iterate(n.line, item));
    if (parts.size() != n.targets.size())
      return error(n.line, parts.size() < n.targets.size()
                               ? "not enough values to unpack (expected " + std::to_string(n.targets.size()) + ")"
                               : "too many values to unpack (expected " + std::to_string(n.targets.size()) + ")");
    for (size_t k = 0; k < n.targets.size(); ++k) scopes_.back().vars[n.targets[k]] = std::move(parts[k]);
    return Status::ok();
  }

  [[gnu::noinline]] Result<Flow> exec_for(const Node& n, std::string* out) {
    AFD_ASSIGN_OR_RETURN(Value seq, eval(*n.expr));
    AFD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(n.line, seq));
    // `for x in xs if cond` filters before loop indices are assigned.
    if (n.filter) {
      std::vector<Value> kept;
      for (Value& it : items) {
        scopes_.emplace_back();
        Status s = bind_targets(n, it);
        Result<Value> c = s.is_ok() ? eval(*n.filter) : Result<Value>(s);
        scopes_.pop_back();
        if (!c.ok()) return c.status();
        if (truthy(*c)) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_list(n.else_body, out);
    LoopState state;
    state.length = static_cast<int64_t>(items.size());
    state.items = &items;
    scopes_.emplace_back();
    scopes_.back().loop = &state;
    struct Pop {
      std::vector<Scope>* s;
      ~Pop() { s->pop_back(); }
    } pop{&scopes_};
    for (; state.index0 < state.length; ++state.index0) {
      AFD_RETURN_IF_ERROR(step(n.line));
      scopes_.back().vars.clear();  // each iteration starts with a fresh scope
      AFD_RETURN_IF_ERROR(bind_targets(n, items[static_cast<size_t>(state.index0)]));
      AFD_ASSIGN_OR_RETURN(Flow f, exec_list(n.body, out));
      if (f == Flow::brk) break;
    }
    return Flow::normal;
  }

  // ---- expressions --------------------------------------------------------------------
  static bool truthy(const Value& v) { return !v.undef() && (v.callable() || py_truthy(v.j())); }

  Result<Value> eval(const Expr& e) {
    Depth d(&depth_);
    AFD_RETURN_IF_ERROR(depth_ok(e.line));
    AFD_RETURN_IF_ERROR(step(e.line));
    switch (e.kind) {
      case Expr::literal:
        return Value::borrow(e.value);
      case Expr::var: {
        const Value* v = lookup(e.name);
        if (v) return *v;
        if (e.name == "loop")
          if (const LoopState* L = find_loop()) return loop_value(e.line, *L);
        return Value::undefined(&e.name);
      }
      case Expr::attr: {
        if (e.args[0]->kind == Expr::var && e.args[0]->name == "loop")
          if (const LoopState* L = find_loop()) return loop_attr(e.line, *L, e.name);
        AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
        return get_attr(e.line, o, e.name);
      }
      case Expr::index:
        return eval_index(e);
      case Expr::slice:
        return eval_slice(e);
      case Expr::call:
        return eval_call(e);
      case Expr::filter:
        return eval_filter(e);
      case Expr::test:
        return eval_test(e);
      case Expr::unary:
        return eval_unary(e);
      case Expr::binary:
        return eval_binary(e);
      case Expr::cond: {
        AFD_ASSIGN_OR_RETURN(Value c, eval(*e.args[1]));
        if (truthy(c)) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined();
      }
      case Expr::list:
      case Expr::dict:
        return eval_literal(e);
    }
    return Value::undefined();
  }

  // The cases of eval() live in their own functions so that eval's frame, which every
  // level of expression nesting adds to the stack, stays small.
  [[gnu::noinline]] Result<Value> eval_index(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
    AFD_ASSIGN_OR_RETURN(Value k, eval(*e.args[1]));
    return get_item(e.line, o, k);
  }
  [[gnu::noinline]] Result<Value> eval_filter(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
    AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    return apply_filter(e.line, e.name, x, a);
  }
  [[gnu::noinline]] Result<Value> eval_test(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
    AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    AFD_ASSIGN_OR_RETURN(bool r, run_test(e.line, e.name, x, a));
    return truth(e.negate ? !r : r);
  }
  [[gnu::noinline]] Result<Value> eval_unary(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
    if (e.name == "not") return truth(!truthy(x));
    if (x.undef()) return undefined_error(e.line, x);
    const json& j = x.j();
    if (!numeric(j)) return error(e.line, "bad operand type for unary " + e.name + ": '" + type_name(x) + "'");
    if (is_float(j)) return Value::of(json(e.name == "-" ? -j.get<double>() : j.get<double>()));
    __int128 v = as_int(j);
    if (e.name == "-") v = -v;
    if (v > INT64_MAX || v < INT64_MIN) return error(e.line, "integer overflow in unary " + e.name);
    return Value::of(json(static_cast<int64_t>(v)));
  }
  [[gnu::noinline]] Result<Value> eval_literal(const Expr& e) {
    if (e.kind == Expr::list) {
      json a = json::array();
      for (const auto& x : e.args) {
        AFD_ASSIGN_OR_RETURN(Value v, eval(*x));
        AFD_ASSIGN_OR_RETURN(json item, take(e.line, std::move(v), 1));
        a.push_back(std::move(item));
      }
      return Value::of(std::move(a));
    }
    json o = json::object();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      AFD_ASSIGN_OR_RETURN(Value k, eval(*e.args[i]));
      AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1]));
      if (!k.j().is_string() || k.undef()) return error(e.line, "dict keys must be strings");
      AFD_ASSIGN_OR_RETURN(json item, take(e.line, std::move(v), 1));
      o[k.j().get<std::string>()] = std::move(item);
    }
    return Value::of(std::move(o));
  }

  // Python methods of the value's type that jinja2's immutable sandbox lets a template
  // fetch (mutating ones are "unsafe" and read as undefined), or nullptr.
  static const char* safe_method(const json& j, const std::string& name) {
    static const char* const kDict[] = {"copy", "fromkeys", "get", "items", "keys", "values"};
    static const char* const kList[] = {"copy", "count", "index"};
    static const char* const kStr[] = {
        "capitalize", "casefold", "center",     "count",      "encode",       "endswith",    "expandtabs",
        "find",       "format",   "format_map", "index",      "isalnum",      "isalpha",     "isascii",
        "isdecimal",  "isdigit",  "isidentifier", "islower",  "isnumeric",    "isprintable", "isspace",
        "istitle",    "isupper",  "join",       "ljust",      "lower",        "lstrip",      "maketrans",
        "partition",  "removeprefix", "removesuffix", "replace", "rfind",     "rindex",      "rjust",
        "rpartition", "rsplit",   "rstrip",     "split",      "splitlines",   "startswith",  "strip",
        "swapcase",   "title",    "translate",  "upper",      "zfill"};
    auto find = [&](const auto& table) -> const char* {
      for (const char* m : table)
        if (name == m) return m;
      return nullptr;
    };
    if (j.is_object()) return find(kDict);
    if (j.is_array()) return find(kList);
    if (j.is_string()) return find(kStr);
    return nullptr;
  }
  static Value method_value(const Value& receiver, const char* m) {
    Value v;
    v.p = receiver.p;
    v.method = m;
    return v;
  }

  // jinja2's getattr: Python attributes (a dict's methods) first, then the dict's key;
  // anything else is undefined. Undefined itself has no attributes.
  [[gnu::noinline]] Result<Value> get_attr(int line, const Value& o, const std::string& name) {
    if (o.undef()) return undefined_error(line, o);
    const json& j = o.j();
    if (const char* m = safe_method(j, name)) return method_value(o, m);
    if (j.is_object()) {
      auto it = j.find(name);
      if (it != j.end()) return o.part(*it);
    }
    return Value::undefined(&name);
  }

  // jinja2's subscript: list/string index (negative from the end), dict key; a missing
  // item is undefined.
  [[gnu::noinline]] Result<Value> get_item(int line, const Value& o, const Value& k) {
    if (o.undef()) return undefined_error(line, o);
    const json& j = o.j();
    const json& key = k.j();
    if (j.is_array() && (key.is_number_integer() || key.is_boolean())) {
      __int128 i = as_int(key), n = static_cast<__int128>(j.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      return o.part(j[static_cast<size_t>(i)]);
    }
    if (j.is_object() && key.is_string()) {
      auto it = j.find(key.get_ref<const std::string&>());
      if (it != j.end()) return o.part(*it);
      // jinja2's subscript falls back to the attribute: d['items'] is d.items.
      if (const char* m = safe_method(j, key.get_ref<const std::string&>())) return method_value(o, m);
      return Value::undefined(&key.get_ref<const std::string&>());
    }
    if (key.is_string() && !k.undef())
      if (const char* m = safe_method(j, key.get_ref<const std::string&>())) return method_value(o, m);
    if (j.is_string() && key.is_number_integer()) {
      const std::string& s = j.get_ref<const std::string&>();
      AFD_RETURN_IF_ERROR(scan(line, s.size()));
      __int128 i = as_int(key), n = static_cast<__int128>(utf8_length(s));
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      size_t b = utf8_offset(s, static_cast<size_t>(i));
      size_t len = 1;
      utf8_decode(s, b, &len);
      return str_value(line, s.substr(b, len));
    }
    return Value::undefined();
  }

  [[gnu::noinline]] Result<Value> eval_slice(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
    if (o.undef()) return undefined_error(e.line, o);
    int64_t idx[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[k + 1]));
      if (v.undef() || v.j().is_null()) continue;
      if (!v.j().is_number_integer()) return error(e.line, "slice indices must be integers or None");
      idx[k] = v.j().get<int64_t>();
      given[k] = true;
    }
    const int64_t step_by = idx[2];
    if (step_by == 0) return error(e.line, "slice step cannot be zero");
    const json& j = o.j();
    std::vector<uint32_t> offs;  // a non-ASCII string's code point offsets, and its size
    int64_t n;
    if (j.is_array()) {
      n = static_cast<int64_t>(j.size());
    } else if (j.is_string()) {
      const std::string& str = j.get_ref<const std::string&>();
      AFD_RETURN_IF_ERROR(scan(e.line, str.size()));
      if (std::any_of(str.begin(), str.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
        AFD_RETURN_IF_ERROR(alloc(e.line, 4 * (str.size() + 1)));
        for (size_t i = 0; i < str.size(); ++i)
          if ((static_cast<unsigned char>(str[i]) & 0xC0) != 0x80) offs.push_back(static_cast<uint32_t>(i));
        offs.push_back(static_cast<uint32_t>(str.size()));
        n = static_cast<int64_t>(offs.size()) - 1;
      } else {
        n = static_cast<int64_t>(str.size());
      }
    } else {  // jinja2 compiles slices to Python's own subscript, which raises
      return error(e.line, "'" + std::string(type_name(o)) + "' object is not subscriptable");
    }
    auto norm = [&](int64_t v, bool g, int64_t def) {
      if (!g) return def;
      if (v < 0) v = std::max<int64_t>(v, INT64_MIN + n) + n;
      if (step_by > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = norm(idx[0], given[0], step_by > 0 ? 0 : n - 1);
    const int64_t stop = norm(idx[1], given[1], step_by > 0 ? n : -1);
    __int128 count = 0;
    if (step_by > 0 && stop > start) count = (static_cast<__int128>(stop) - start + step_by - 1) / step_by;
    if (step_by < 0 && stop < start) count = (static_cast<__int128>(start) - stop - step_by - 1) / -static_cast<__int128>(step_by);
    AFD_RETURN_IF_ERROR(step(e.line, static_cast<int64_t>(count)));
    if (j.is_array()) {
      json a = json::array();
      for (__int128 k = 0; k < count; ++k) {
        const json& item = j[static_cast<size_t>(start + k * step_by)];
        AFD_RETURN_IF_ERROR(admit(e.line, item, 1));
        a.push_back(item);
      }
      return Value::of(std::move(a));
    }
    const std::string& str = j.get_ref<const std::string&>();
    std::string r;
    for (__int128 k = 0; k < count; ++k) {
      size_t i = static_cast<size_t>(start + k * step_by);
      if (offs.empty()) r += str[i];
      else r.append(str, offs[i], offs[i + 1] - offs[i]);
    }
    return str_value(e.line, std::move(r));
  }

  Result<Args> eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) {
      AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
      a.pos.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      AFD_ASSIGN_OR_RETURN(Value v, eval(*x));
      a.kw.push_back({k, std::move(v)});
    }
    return a;
  }

  [[gnu::noinline]] Result<Value> eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::attr && callee.name == "cycle" && callee.args[0]->kind == Expr::var &&
        callee.args[0]->name == "loop") {
      if (const LoopState* L = find_loop()) {
        AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
        if (a.pos.empty()) return error(e.line, "no items for cycling given");
        return a.pos[static_cast<size_t>(L->index0) % a.pos.size()];
      }
    }
    if (callee.kind == Expr::attr) {
      AFD_ASSIGN_OR_RETURN(Value self, eval(*callee.args[0]));
      if (self.undef()) return undefined_error(e.line, self);
      AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
      return call_method(e.line, self, callee.name, a);
    }
    if (callee.kind != Expr::var) return error(e.line, "only named functions, macros and methods can be called");
    const std::string& f = callee.name;
    AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    size_t defined_in = 0;
    if (const Value* v = lookup(f, &defined_in); v && v->macro) return call_macro(e.line, *v->macro, defined_in, a);
    if (f == "raise_exception") {
      std::string msg = "error";
      if (const Value* m = a.get(0, "message")) {
        AFD_ASSIGN_OR_RETURN(msg, to_str(e.line, *m));
      }
      return invalid_argument("chat template raised: " + msg);
    }
    if (f == "namespace" || f == "dict") {
      json o = json::object();
      for (const Value& p : a.pos) {  // namespace({'a': 1}) / dict(other)
        if (!p.j().is_object()) return error(e.line, f + "() takes mappings and keyword arguments");
        for (auto it = p.j().begin(); it != p.j().end(); ++it) {
          AFD_RETURN_IF_ERROR(admit(e.line, it.value(), 1));
          o[it.key()] = it.value();
        }
      }
      for (auto& [k, v] : a.kw) {
        AFD_ASSIGN_OR_RETURN(json x, take(e.line, std::move(v), 1));
        o[k] = std::move(x);
      }
      return Value::of(std::move(o));
    }
    if (f == "range") {
      int64_t lo = 0, hi = 0, by = 1;
      for (const Value& x : a.pos)
        if (!x.j().is_number_integer() || x.undef()) return error(e.line, "range() takes integers");
      if (a.pos.size() == 1) hi = a.pos[0].j().get<int64_t>();
      else if (a.pos.size() >= 2) lo = a.pos[0].j().get<int64_t>(), hi = a.pos[1].j().get<int64_t>();
      if (a.pos.size() == 3) by = a.pos[2].j().get<int64_t>();
      if (a.pos.empty() || a.pos.size() > 3) return error(e.line, "range() takes 1 to 3 integers");
      if (by == 0) return error(e.line, "range() arg 3 must not be zero");
      __int128 count = 0;
      if (by > 0 && hi > lo) count = ((__int128)hi - lo + by - 1) / by;
      if (by < 0 && hi < lo) count = ((__int128)lo - hi - by - 1) / -by;
      if (count > lim_.max_range)
        return limit_error(e.line, "range() has more items than", "max_range", lim_.max_range);
      AFD_RETURN_IF_ERROR(step(e.line, static_cast<int64_t>(count)));
      AFD_RETURN_IF_ERROR(alloc(e.line, static_cast<size_t>(count) * 32));
      json r = json::array();
      for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) r.push_back(lo + k * by);
      return Value::of(std::move(r));
    }
    if (f == "strftime_now") {
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      std::string fmt = "%Y-%m-%d";
      if (const Value* v = a.get(0, "format")) {
        AFD_ASSIGN_OR_RETURN(fmt, to_str(e.line, *v));
      }
      if (fmt.size() > 256) return error(e.line, "strftime_now() format longer than 256 bytes");
      std::string buf(4096, '\0');  // on the heap: this frame is part of macro recursion
      size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
      buf.resize(n);
      return str_value(e.line, std::move(buf));
    }
    return error(e.line, "'" + f + "' is undefined");
  }

  Value macro_value(const Node& n) {
    Value v;
    v.p = macro_placeholder_;
    v.macro = &n;
    return v;
  }

  [[gnu::noinline]] Result<Value> call_macro(int line, const Node& m, size_t defined_in, const Args& a) {
    if (call_depth_ >= lim_.max_call_depth)
      return limit_error(line, "macro calls nested deeper than", "max_call_depth", lim_.max_call_depth);
    if (a.pos.size() > m.params.size())
      return error(line, "macro '" + m.targets[0] + "' takes not more than " + std::to_string(m.params.size()) +
                             " argument(s)");
    for (const auto& [k, v] : a.kw) {
      bool known = false;
      for (const auto& p : m.params) known = known || p.first == k;
      if (!known) return error(line, "macro '" + m.targets[0] + "' takes no keyword argument '" + k + "'");
    }
    Scope scope;
    scope.macro_frame = true;
    scope.parent = defined_in;
    scopes_.push_back(std::move(scope));
    ++call_depth_;
    struct Pop {
      Evaluator* ev;
      ~Pop() {
        ev->scopes_.pop_back();
        --ev->call_depth_;
      }
    } pop{this};
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      Value v = Value::undefined(&name);
      if (const Value* given = a.get(i, name.c_str())) {
        v = *given;
      } else if (def) {
        AFD_ASSIGN_OR_RETURN(v, eval(*def));
      }
      scopes_.back().vars[name] = std::move(v);
    }
    std::string out;
    AFD_ASSIGN_OR_RETURN(Flow f, exec_list(m.body, &out));
    (void)f;
    return Value::of(json(std::move(out)));
  }

  // ---- methods ------------------------------------------------------------------------
  Result<std::string> str_arg(int line, const Args& a, size_t i, const char* name, const std::string& def) {
    const Value* v = a.get(i, name);
    if (!v || v->undef() || v->j().is_null()) return def;
    if (!v->j().is_string()) return error(line, std::string("argument '") + name + "' must be a string");
    return v->j().get<std::string>();
  }
  Result<int64_t> int_arg(int line, const Args& a, size_t i, const char* name, int64_t def) {
    const Value* v = a.get(i, name);
    if (!v || v->undef() || v->j().is_null()) return def;
    if (!v->j().is_number_integer() && !v->j().is_boolean())
      return error(line, std::string("argument '") + name + "' must be an integer");
    return static_cast<int64_t>(as_int(v->j()));
  }

  Result<Value> split(int line, const std::string& s, const Args& a, bool from_right) {
    AFD_ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(line, a, 1, "maxsplit", -1));
    const Value* sepv = a.get(0, "sep");
    AFD_RETURN_IF_ERROR(scan(line, s.size()));
    std::vector<std::string> parts;
    if (!sepv || sepv->undef() || sepv->j().is_null()) {
      // Runs of whitespace separate; leading/trailing whitespace yields no empty parts.
      std::vector<std::pair<size_t, size_t>> words;  // [begin, end) byte ranges
      size_t i = 0;
      while (i < s.size()) {
        size_t len = 1;
        if (py_isspace(utf8_decode(s, i, &len))) {
          i += len;
          continue;
        }
        size_t b = i;
        while (i < s.size()) {
          size_t l2 = 1;
          if (py_isspace(utf8_decode(s, i, &l2))) break;
          i += l2;
        }
        words.push_back({b, i});
      }
      if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
        for (auto [b, e] : words) parts.push_back(s.substr(b, e - b));
      } else if (!from_right) {
        for (int64_t k = 0; k < maxsplit; ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
        parts.push_back(py_strip(s.substr(words[static_cast<size_t>(maxsplit)].first), nullptr, false, true));
      } else {
        size_t keep = words.size() - static_cast<size_t>(maxsplit);
        parts.push_back(py_strip(s.substr(0, words[keep - 1].second), nullptr, true, false));
        for (size_t k = keep; k < words.size(); ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      }
    } else {
      if (!sepv->j().is_string()) return error(line, "split() separator must be a string or None");
      const std::string& sep = sepv->j().get_ref<const std::string&>();
      if (sep.empty()) return error(line, "empty separator");
      std::vector<size_t> hits;
      for (size_t j = s.find(sep); j != std::string::npos; j = s.find(sep, j + sep.size())) hits.push_back(j);
      if (maxsplit >= 0 && hits.size() > static_cast<size_t>(maxsplit)) {
        if (from_right) {
          // rsplit: the rightmost non-overlapping matches, found from the right.
          hits.clear();
          size_t end = s.size();
          while (static_cast<int64_t>(hits.size()) < maxsplit && end >= sep.size()) {
            size_t j = s.rfind(sep, end - sep.size());
            if (j == std::string::npos) break;
            hits.insert(hits.begin(), j);
            if (j == 0) break;
            end = j;
          }
        } else {
          hits.resize(static_cast<size_t>(maxsplit));
        }
      }
      size_t b = 0;
      for (size_t j : hits) {
        parts.push_back(s.substr(b, j - b));
        b = j + sep.size();
      }
      parts.push_back(s.substr(b));
    }
    AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(parts.size())));
    AFD_RETURN_IF_ERROR(alloc(line, s.size() + 64 * parts.size()));
    json arr = json::array();
    for (auto& p : parts) arr.push_back(std::move(p));
    return Value::of(std::move(arr));
  }

  [[gnu::noinline]] Result<Value> call_method(int line, const Value& self, const std::string& m, const Args& a) {
    const json& j = self.j();
    if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      AFD_RETURN_IF_ERROR(scan(line, s.size()));
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        const Value* cv = a.get(0, "chars");
        std::string chars;
        bool have = cv && !cv->undef() && !cv->j().is_null();
        if (have) {
          if (!cv->j().is_string()) return error(line, m + " arg must be None or str");
          chars = cv->j().get<std::string>();
        }
        return str_value(line, py_strip(s, have ? &chars : nullptr, m != "rstrip", m != "lstrip"));
      }
      if (m == "startswith" || m == "endswith") {
        const Value* pv = a.get(0, "prefix");
        if (!pv) return error(line, m + "() takes at least 1 argument");
        std::vector<std::string> pre;
        if (pv->j().is_array()) {
          for (const json& x : pv->j()) {
            if (!x.is_string()) return error(line, m + "() arguments must be strings");
            pre.push_back(x.get<std::string>());
          }
        } else if (pv->j().is_string() && !pv->undef()) {
          pre.push_back(pv->j().get<std::string>());
        } else {
          return error(line, m + "() argument must be str or a tuple of str");
        }
        bool r = false;
        for (const auto& p : pre)
          r = r || (s.size() >= p.size() &&
                    (m == "startswith" ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0));
        return Value::of(json(r));
      }
      if (m == "split" || m == "rsplit") return split(line, s, a, m == "rsplit");
      if (m == "splitlines") {
        AFD_RETURN_IF_ERROR(alloc(line, s.size() + 64 * (count_lines(s) + 1)));
        std::vector<std::string> lines = py_splitlines(s);
        json arr = json::array();
        for (auto& l : lines) arr.push_back(std::move(l));
        return Value::of(std::move(arr));
      }
      if (m == "upper" || m == "lower" || m == "title" || m == "capitalize") {
        CaseMode mode = m == "upper" ? CaseMode::upper : m == "lower" ? CaseMode::lower
                        : m == "title" ? CaseMode::title_py : CaseMode::capitalize;
        return str_value(line, map_case(s, mode));
      }
      if (m == "replace") {
        AFD_ASSIGN_OR_RETURN(std::string from, str_arg(line, a, 0, "old", ""));
        AFD_ASSIGN_OR_RETURN(std::string to, str_arg(line, a, 1, "new", ""));
        AFD_ASSIGN_OR_RETURN(int64_t count, int_arg(line, a, 2, "count", -1));
        return replace(line, s, from, to, count);
      }
      if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
        AFD_ASSIGN_OR_RETURN(std::string sub, str_arg(line, a, 0, "sub", ""));
        if (m == "count") {
          int64_t n = 0;
          if (sub.empty()) n = static_cast<int64_t>(utf8_length(s)) + 1;
          else
            for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
          return Value::of(json(n));
        }
        size_t p = (m == "find" || m == "index") ? s.find(sub) : s.rfind(sub);
        if (p == std::string::npos) {
          if (m == "index" || m == "rindex") return error(line, "substring not found");
          return Value::of(json(int64_t{-1}));
        }
        return Value::of(json(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p)))));
      }
      if (m == "join") {
        const Value* it = a.get(0, "iterable");
        if (!it) return error(line, "join() takes exactly one argument");
        return join(line, *it, s, nullptr);
      }
      if (m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isspace" || m == "islower" || m == "isupper") {
        bool r = !s.empty();
        bool cased = false;
        for (size_t i = 0; i < s.size() && r;) {
          size_t len = 1;
          char32_t c = utf8_decode(s, i, &len);
          i += len;
          if (m == "isspace") r = py_isspace(c);
          else if (m == "isdigit") r = c < 0x80 && std::isdigit(static_cast<int>(c));
          else if (m == "isalpha") r = c >= 0x80 ? is_letter(c) : std::isalpha(static_cast<int>(c)) != 0;
          else if (m == "isalnum") r = c >= 0x80 ? (is_letter(c) || is_number(c)) : std::isalnum(static_cast<int>(c)) != 0;
          else if (cp_is_cased(c)) {
            cased = true;
            r = m == "islower" ? !cp_is_upper(c) : !cp_is_lower(c);
          }
        }
        if (m == "islower" || m == "isupper") r = r && cased;
        return Value::of(json(r));
      }
    }
    if (j.is_array() && (m == "count" || m == "index")) {
      const Value* v = a.get(0, "value");
      if (!v) return error(line, m + "() takes exactly one argument");
      AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(j.size())));
      int64_t n = 0;
      for (size_t i = 0; i < j.size(); ++i) {
        if (v->undef() ? !j[i].is_discarded() : !py_equal(j[i], v->j())) continue;
        if (m == "index") return Value::of(json(static_cast<int64_t>(i)));
        ++n;
      }
      if (m == "index") return error(line, "value is not in list");
      return Value::of(json(n));
    }
    if (j.is_object()) {
      if (m == "items" || m == "keys" || m == "values") {
        AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(j.size())));
        json arr = json::array();
        for (auto it = j.begin(); it != j.end(); ++it) {
          if (m == "keys") {
            arr.push_back(it.key());
            continue;
          }
          AFD_RETURN_IF_ERROR(admit(line, it.value(), m == "items" ? 2 : 1));
          arr.push_back(m == "items" ? json::array({it.key(), it.value()}) : it.value());
        }
        return Value::of(std::move(arr));
      }
      if (m == "get") {
        const Value* k = a.get(0, "key");
        if (!k) return error(line, "get() takes at least 1 argument");
        if (k->j().is_string() && !k->undef()) {
          auto it = j.find(k->j().get_ref<const std::string&>());
          if (it != j.end()) return self.part(*it);
        }
        const Value* d = a.get(1, "default");
        return d ? *d : Value::of(json());
      }
    }
    return error(line, "'" + std::string(type_name(self)) + "' object has no method '" + m + "'");
  }

  Result<Value> replace(int line, const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    std::string r;
    int64_t done = 0;
    auto grow = [&](size_t add) -> Status {
      if (r.size() + add > lim_.max_output_bytes)
        return limit_error(line, "a string would be longer than", "max_output_bytes",
                           static_cast<int64_t>(lim_.max_output_bytes));
      return Status::ok();
    };
    if (from.empty()) {  // Python inserts `to` around every character
      for (size_t i = 0; i < s.size();) {
        size_t len = 1;
        utf8_decode(s, i, &len);
        if (count < 0 || done < count) {
          AFD_RETURN_IF_ERROR(grow(to.size()));
          r += to;
          ++done;
        }
        AFD_RETURN_IF_ERROR(grow(len));
        r.append(s, i, len);
        i += len;
      }
      if (count < 0 || done < count) {
        AFD_RETURN_IF_ERROR(grow(to.size()));
        r += to;
      }
      return str_value(line, std::move(r));
    }
    size_t i = 0;
    for (size_t j; (count < 0 || done < count) && (j = s.find(from, i)) != std::string::npos; i = j + from.size()) {
      AFD_RETURN_IF_ERROR(grow(j - i + to.size()));
      r.append(s, i, j - i);
      r += to;
      ++done;
    }
    AFD_RETURN_IF_ERROR(grow(s.size() - i));
    r.append(s, i);
    return str_value(line, std::move(r));
  }

  // str.join / the join filter: str() of each item (of an attribute of each item when
  // `attribute` is given) with `sep` between.
  Result<Value> join(int line, const Value& seq, const std::string& sep, const std::string* attribute) {
    AFD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(line, seq));
    std::string r;
    bool first = true;
    for (const Value& item : items) {
      Value x = item;
      if (attribute) {
        AFD_ASSIGN_OR_RETURN(x, attr_path(line, item, *attribute));
      }
      if (!first) {
        if (r.size() + sep.size() > lim_.max_output_bytes)
          return limit_error(line, "a string would be longer than", "max_output_bytes",
                             static_cast<int64_t>(lim_.max_output_bytes));
        r += sep;
      }
      first = false;
      size_t before = r.size();
      if (!x.undef() && !py_str(x.j(), true, lim_.max_output_bytes, &r))
        return limit_error(line, "a string would be longer than", "max_output_bytes",
                           static_cast<int64_t>(lim_.max_output_bytes));
      AFD_RETURN_IF_ERROR(alloc(line, r.size() - before));
    }
    return str_value(line, std::move(r));
  }

  // jinja2's attribute getter for filters: "a.b.0" looks up a, then b, then index 0.
  Result<Value> attr_path(int line, const Value& item, const std::string& path) {
    Value v = item;
    size_t b = 0;
    for (;;) {
      size_t e = path.find('.', b);
      std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (v.undef()) return undefined_error(line, v);  // jinja2: Undefined[...] raises
      int64_t idx = 0;
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
          parse_py_int(part, &idx) && v.j().is_array()) {
        AFD_ASSIGN_OR_RETURN(v, get_item(line, v, Value::of(json(idx))));
      } else if (v.j().is_object()) {
        auto it = v.j().find(part);
        v = it == v.j().end() ? Value::undefined() : v.part(*it);
      } else {
        v = Value::undefined();
      }
      if (e == std::string::npos) return v;
      b = e + 1;
    }
  }

  // ---- filters ------------------------------------------------------------------------
  [[gnu::noinline]] Result<Value> apply_filter(int line, const std::string& f, const Value& x, const Args& a) {
    const json& j = x.j();
    if (f == "safe") {  // Markup(value): a string
      AFD_ASSIGN_OR_RETURN(std::string str, to_str(line, x));
      return str_value(line, std::move(str));
    }
    if (f == "default" || f == "d") {
      const Value* bv = a.get(1, "boolean");
      bool boolean = bv && truthy(*bv);
      if (x.undef() || (boolean && !truthy(x))) {
        const Value* dv = a.get(0, "default_value");
        return dv ? *dv : Value::of(json(""));
      }
      return x;
    }
    if (f == "length" || f == "count") {
      if (x.undef()) return Value::of(json(0));
      if (j.is_string()) return Value::of(json(static_cast<int64_t>(utf8_length(j.get_ref<const std::string&>()))));
      if (j.is_array() || j.is_object()) return Value::of(json(static_cast<int64_t>(j.size())));
      return error(line, "object of type '" + std::string(type_name(x)) + "' has no len()");
    }
    if (f == "tojson") return tojson(line, x, a);
    if (f == "string") {
      AFD_ASSIGN_OR_RETURN(std::string s, to_str(line, x));
      return str_value(line, std::move(s));
    }
    if (f == "trim") {
      AFD_ASSIGN_OR_RETURN(std::string s, to_str(line, x));
      AFD_RETURN_IF_ERROR(scan(line, s.size()));
      const Value* cv = a.get(0, "chars");
      if (cv && !cv->undef() && !cv->j().is_null()) {
        if (!cv->j().is_string()) return error(line, "trim() chars must be a string");
        std::string chars = cv->j().get<std::string>();
        return str_value(line, py_strip(s, &chars, true, true));
      }
      return str_value(line, py_strip(s, nullptr, true, true));
    }
    if (f == "lower" || f == "upper" || f == "capitalize") {
      AFD_ASSIGN_OR_RETURN(std::string s, to_str(line, x));
      return call_method(line, Value::of(json(std::move(s))), f, Args{});
    }
    if (f == "title") {
      AFD_ASSIGN_OR_RETURN(std::string s, to_str(line, x));
      return str_value(line, map_case(s, CaseMode::title_jinja));
    }
    if (f == "replace") {
      AFD_ASSIGN_OR_RETURN(std::string s, to_str(line, x));
      AFD_RETURN_IF_ERROR(scan(line, s.size()));
      AFD_ASSIGN_OR_RETURN(std::string from, str_arg(line, a, 0, "old", ""));
      AFD_ASSIGN_OR_RETURN(std::string to, str_arg(line, a, 1, "new", ""));
      AFD_ASSIGN_OR_RETURN(int64_t count, int_arg(line, a, 2, "count", -1));
      return replace(line, s, from, to, count);
    }
    if (f == "escape" || f == "e" || f == "forceescape") {
      AFD_ASSIGN_OR_RETURN(std::string s, to_str(line, x));
      std::string r;
      for (char c : s) {
        switch (c) {
          case '&': r += "&amp;"; break;
          case '<': r += "&lt;"; break;
          case '>': r += "&gt;"; break;
          case '"': r += "&#34;"; break;
          case '\'': r += "&#39;"; break;
          default: r += c;
        }
      }
      return str_value(line, std::move(r));
    }
    if (f == "indent") return indent(line, x, a);
    if (f == "join") {
      AFD_ASSIGN_OR_RETURN(std::string sep, str_arg(line, a, 0, "d", ""));
      const Value* attr = a.get(1, "attribute");
      std::string attribute = attr && attr->j().is_string() ? attr->j().get<std::string>() : "";
      return join(line, x, sep, attr && attr->j().is_string() ? &attribute : nullptr);
    }
    if (f == "first" || f == "last") {
      if (x.undef()) return Value::undefined();
      if (j.is_array()) {
        if (j.empty()) return Value::undefined();
        return x.part(f == "first" ? j.front() : j.back());
      }
      AFD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(line, x));
      if (items.empty()) return Value::undefined();
      return f == "first" ? items.front() : items.back();
    }
    if (f == "list" || f == "reverse" || f == "unique" || f == "sort" || f == "dictsort" || f == "items" ||
        f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr" || f == "map" || f == "min" ||
        f == "max" || f == "sum")
      return sequence_filter(line, f, x, a);
    if ((f == "int" || f == "float" || f == "round" || f == "indent") && x.undef()) return undefined_error(line, x);
    if (f == "int") {
      const Value* dv = a.get(0, "default");
      Value def = dv ? *dv : Value::of(json(0));
      if (j.is_number_integer() && !x.undef()) return x;
      if (j.is_boolean()) return Value::of(json(static_cast<int64_t>(j.get<bool>())));
      double d = 0;
      int64_t v = 0;
      if (j.is_number_float()) d = j.get<double>();
      else if (j.is_string() && parse_py_int(j.get_ref<const std::string&>(), &v)) return Value::of(json(v));
      else if (!(j.is_string() && parse_py_float(j.get_ref<const std::string&>(), &d)))
        return def;
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
      return Value::of(json(static_cast<int64_t>(d)));
    }
    if (f == "float") {
      const Value* dv = a.get(0, "default");
      Value def = dv ? *dv : Value::of(json(0.0));
      if (numeric(j) && !x.undef()) return Value::of(json(as_double(j)));
      double d = 0;
      if (j.is_string() && parse_py_float(j.get_ref<const std::string&>(), &d)) return Value::of(json(d));
      return def;
    }
    if (f == "abs") {
      if (!numeric(j) || x.undef()) return error(line, "bad operand type for abs(): '" + std::string(type_name(x)) + "'");
      if (is_float(j)) return Value::of(json(std::fabs(j.get<double>())));
      __int128 v = as_int(j);
      if (v < 0) v = -v;
      if (v > INT64_MAX) return error(line, "integer overflow in abs");
      return Value::of(json(static_cast<int64_t>(v)));
    }
    if (f == "round") {  // Python's round(): half to even on the exact binary value
      if (!numeric(j) || x.undef()) return error(line, "round() of a non-number");
      AFD_ASSIGN_OR_RETURN(int64_t prec, int_arg(line, a, 0, "precision", 0));
      AFD_ASSIGN_OR_RETURN(std::string method, str_arg(line, a, 1, "method", "common"));
      if (method != "common" && method != "floor" && method != "ceil")
        return error(line, "method must be common, ceil or floor");
      if (prec < -300 || prec > 300) return error(line, "round() precision out of range");
      if (method != "common") {  // math.floor/ceil(value * 10**precision) / 10**precision
        double scale = std::pow(10.0, static_cast<double>(prec));
        double v = as_double(j) * scale;
        return Value::of(json((method == "floor" ? std::floor(v) : std::ceil(v)) / scale));
      }
      if (!is_float(j)) {  // round(int, n) stays an int
        __int128 v = as_int(j);
        if (prec >= 0) return Value::of(json(static_cast<int64_t>(v)));
        __int128 m = 1;
        for (int64_t k = 0; k < -prec && m < (static_cast<__int128>(1) << 100); ++k) m *= 10;
        __int128 q = v / m, r = v % m;
        if (r < 0) q -= 1, r += m;
        if (2 * r > m || (2 * r == m && q % 2 != 0)) q += 1;
        __int128 res = q * m;
        if (res > INT64_MAX || res < INT64_MIN) return error(line, "integer overflow in round");
        return Value::of(json(static_cast<int64_t>(res)));
      }
      double v = j.get<double>();
      if (!std::isfinite(v)) return Value::of(json(v));
      if (prec < 0) {
        double m = std::pow(10.0, static_cast<double>(-prec));
        return Value::of(json(std::nearbyint(v / m) * m));
      }
      int n = std::snprintf(nullptr, 0, "%.*f", static_cast<int>(prec), v);
      std::string buf(static_cast<size_t>(n) + 1, '\0');
      std::snprintf(buf.data(), buf.size(), "%.*f", static_cast<int>(prec), v);
      return Value::of(json(std::strtod(buf.c_str(), nullptr)));
    }
    if (f == "wordcount") {
      AFD_ASSIGN_OR_RETURN(std::string s, to_str(line, x));
      int64_t n = 0;
      bool in_word = false;
      for (size_t i = 0; i < s.size();) {
        size_t len = 1;
        char32_t c = utf8_decode(s, i, &len);
        bool w = c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : (is_letter(c) || is_number(c)));
        if (w && !in_word) ++n;
        in_word = w;
        i += len;
      }
      return Value::of(json(n));
    }
    return error(line, "no filter named '" + f + "'");
  }

  Result<Value> tojson(int line, const Value& x, const Args& a) {
    // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    if (x.undef() || x.callable() || contains_undefined(x.j()))
      return error(line, std::string("Object of type ") + (x.callable() ? type_name(x) : "Undefined") +
                             " is not JSON serializable");
    DumpOptions o;
    if (const Value* v = a.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*v);
    if (const Value* v = a.get(1, "indent"); v && !v->undef() && !v->j().is_null()) {
      if (!v->j().is_number_integer()) return error(line, "tojson indent must be an integer");
      o.indent = static_cast<int>(std::clamp<int64_t>(v->j().get<int64_t>(), 0, 64));
      o.item_sep = ",";
    }
    if (const Value* v = a.get(2, "separators"); v && !v->undef() && !v->j().is_null()) {
      const json& sj = v->j();
      if (!sj.is_array() || sj.size() != 2 || !sj[0].is_string() || !sj[1].is_string())
        return error(line, "tojson separators must be a pair of strings");
      o.item_sep = sj[0].get<std::string>();
      o.key_sep = sj[1].get<std::string>();
    }
    if (const Value* v = a.get(3, "sort_keys")) o.sort_keys = truthy(*v);
    std::string s;
    if (!py_dumps(x.j(), o, lim_.max_output_bytes, &s))
      return limit_error(line, "tojson output would be longer than", "max_output_bytes",
                         static_cast<int64_t>(lim_.max_output_bytes));
    AFD_RETURN_IF_ERROR(scan(line, s.size()));
    return str_value(line, std::move(s));
  }

  Result<Value> indent(int line, const Value& x, const Args& a) {
    if (!x.j().is_string())  // jinja2 appends "\n" to the value itself
      return error(line, std::string("unsupported operand type(s) for +=: '") + type_name(x) + "' and 'str'");
    std::string s = x.j().get<std::string>();
    std::string pad(4, ' ');
    if (const Value* w = a.get(0, "width"); w && !w->undef()) {
      if (w->j().is_string()) pad = w->j().get<std::string>();
      else if (w->j().is_number_integer()) pad.assign(static_cast<size_t>(std::clamp<int64_t>(w->j().get<int64_t>(), 0, 256)), ' ');
      else return error(line, "indent width must be an integer or a string");
    }
    const Value* fv = a.get(1, "first");
    const Value* bv = a.get(2, "blank");
    bool first = fv && truthy(*fv), blank = bv && truthy(*bv);
    AFD_RETURN_IF_ERROR(string_size(line, s.size() + (count_lines(s) + 2) * (pad.size() + 1)));
    AFD_RETURN_IF_ERROR(alloc(line, s.size() + 64 * (count_lines(s) + 2)));
    std::vector<std::string> lines = py_splitlines(s + "\n");
    std::string r;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) {
        r += "\n";
        if (blank || !lines[i].empty()) r += pad;
      }
      r += lines[i];
    }
    if (first) r = pad + r;
    return str_value(line, std::move(r));
  }

  // Sorting key: the item or its attribute (shared, not copied), strings lower-cased
  // unless case-sensitive.
  Result<Value> sort_key(int line, const Value& item, const std::string* attribute, bool case_sensitive) {
    Value v = item;
    if (attribute) {
      AFD_ASSIGN_OR_RETURN(v, attr_path(line, item, *attribute));
    }
    if (v.undef()) return error(line, "sort key is undefined");
    if (!case_sensitive && v.j().is_string()) return str_value(line, map_case(v.j().get<std::string>(), CaseMode::lower));
    return v;
  }

  Result<Value> sequence_filter(int line, const std::string& f, const Value& x, const Args& a) {
    const json& j = x.j();
    if (f == "items") {
      if (x.undef()) return Value::of(json::array());
      if (!j.is_object()) return error(line, "can only get item pairs from a mapping");
      return call_method(line, x, "items", Args{});
    }
    if (f == "dictsort") {
      if (!j.is_object()) return error(line, "you can only sort by either \"key\" or \"value\" of a mapping");
      AFD_ASSIGN_OR_RETURN(Value pairs, call_method(line, x, "items", Args{}));
      const Value* cs = a.get(0, "case_sensitive");
      AFD_ASSIGN_OR_RETURN(std::string by, str_arg(line, a, 1, "by", "key"));
      const Value* rv = a.get(2, "reverse");
      size_t pos = by == "value" ? 1 : 0;
      if (by != "key" && by != "value") return error(line, "dictsort by must be 'key' or 'value'");
      json arr = pairs.j();
      bool case_sensitive = cs && truthy(*cs), ok = true;
      auto key = [&](const json& p) {
        return !case_sensitive && p[pos].is_string() ? json(map_case(p[pos].get<std::string>(), CaseMode::lower)) : p[pos];
      };
      std::stable_sort(arr.begin(), arr.end(), [&](const json& p, const json& q) {
        bool o = true;
        bool r = py_less(key(p), key(q), &o);
        ok = ok && o;
        return r;
      });
      if (!ok) return error(line, "dictsort: values are not comparable");
      if (rv && truthy(*rv)) std::reverse(arr.begin(), arr.end());
      return Value::of(std::move(arr));
    }
    if (j.is_string() && f == "reverse") {
      const std::string& str = j.get_ref<const std::string&>();
      AFD_RETURN_IF_ERROR(string_size(line, str.size()));
      std::string r;
      r.reserve(str.size());
      for (size_t end = str.size(); end > 0;) {  // code points from the last
        size_t b = end - 1;
        while (b > 0 && (static_cast<unsigned char>(str[b]) & 0xC0) == 0x80) --b;
        r.append(str, b, end - b);
        end = b;
      }
      return Value::of(json(std::move(r)));
    }
    // jinja2's map/select/reject family starts with `if value:`, so a falsy non-sequence
    // (0, false, none) gives nothing rather than an error.
    bool lazy_family = f == "map" || f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr";
    if (lazy_family && !truthy(x)) return Value::of(json::array());
    if (!x.undef() && !j.is_array() && !j.is_object() && !j.is_string())
      return error(line, "'" + std::string(type_name(x)) + "' object is not iterable");
    AFD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(line, x));
    AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(items.size())));
    auto to_list = [&](const std::vector<Value>& vs) -> Result<Value> {
      json arr = json::array();
      for (const Value& v : vs) {
        AFD_ASSIGN_OR_RETURN(json item, take(line, v, 1));
        arr.push_back(std::move(item));
      }
      return Value::of(std::move(arr));
    };
    if (f == "list") return to_list(items);
    if (f == "reverse") {
      std::reverse(items.begin(), items.end());
      return to_list(items);
    }
    // attribute= is positional after the sort options (sort: 3rd, unique/min/max: 2nd,
    // sum: 1st); map takes it by keyword only.
    const Value* attr = f == "map" ? a.get(SIZE_MAX, "attribute") : a.get(f == "sort" ? 2 : f == "sum" ? 0 : 1, "attribute");
    std::string attribute = attr && attr->j().is_string() ? attr->j().get<std::string>() : "";
    const std::string* attr_p = attr && attr->j().is_string() ? &attribute : nullptr;
    if (f == "sort" || f == "unique" || f == "min" || f == "max") {
      const Value* cs = a.get(f == "sort" ? 1 : 0, "case_sensitive");
      bool case_sensitive = cs && truthy(*cs);
      std::vector<std::pair<Value, Value>> keyed;  // (key, item)
      for (const Value& v : items) {
        AFD_ASSIGN_OR_RETURN(Value k, sort_key(line, v, attr_p, case_sensitive));
        keyed.push_back({std::move(k), v});
      }
      if (f == "unique") {  // a set of the keys: lists and dicts are unhashable
        for (auto& kv : keyed)
          if (kv.first.j().is_structured()) return error(line, std::string("unhashable type: '") + type_name(kv.second) + "'");
        std::vector<Value> out;
        std::vector<Value> seen;
        for (auto& [k, v] : keyed) {
          bool dup = false;
          for (const Value& s : seen) dup = dup || py_equal(s.j(), k.j());
          AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(seen.size())));
          if (!dup) {
            seen.push_back(k);
            out.push_back(v);
          }
        }
        return to_list(out);
      }
      bool ok = true;
      auto less = [&](const std::pair<Value, Value>& p, const std::pair<Value, Value>& q) {
        bool o = true;
        bool r = py_less(p.first.j(), q.first.j(), &o);
        ok = ok && o;
        return r;
      };
      if (f == "sort") {
        std::stable_sort(keyed.begin(), keyed.end(), less);
        if (!ok) return error(line, "sort: items are not comparable");
        const Value* rv = a.get(0, "reverse");
        if (rv && truthy(*rv)) {
          // Python's reverse sort keeps equal items in their original order.
          std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) { return less(q, p); });
        }
        std::vector<Value> out;
        for (auto& kv : keyed) out.push_back(kv.second);
        return to_list(out);
      }
      if (keyed.empty()) return Value::undefined();
      // Both return the first of equal extremes, as Python's min and max do.
      auto it = f == "min" ? std::min_element(keyed.begin(), keyed.end(), less)
                           : std::max_element(keyed.begin(), keyed.end(), less);
      if (!ok) return error(line, f + ": items are not comparable");
      return it->second;
    }
    if (f == "sum") {
      const Value* st = a.get(1, "start");
      json acc = st ? st->j() : json(0);
      for (const Value& v : items) {
        Value x2 = v;
        if (attr_p) {
        AFD_ASSIGN_OR_RETURN(x2, attr_path(line, v, *attr_p));
      }
        if (!numeric(acc) || !numeric(x2.j()) || x2.undef()) return error(line, "sum() of non-numbers");
        if (is_float(acc) || is_float(x2.j())) acc = as_double(acc) + as_double(x2.j());
        else {
          __int128 r = as_int(acc) + as_int(x2.j());
          if (r > INT64_MAX || r < INT64_MIN) return error(line, "integer overflow in sum");
          acc = static_cast<int64_t>(r);
        }
      }
      return Value::of(std::move(acc));
    }
    if (f == "map") {
      std::vector<Value> out;
      if (attr_p) {
        const Value* def = a.get(99, "default");
        for (const Value& v : items) {
          AFD_ASSIGN_OR_RETURN(Value r, attr_path(line, v, *attr_p));
          if (r.undef() && def) r = *def;
          out.push_back(std::move(r));
        }
      } else {
        if (a.pos.empty() || !a.pos[0].j().is_string()) return error(line, "map() needs a filter name or attribute=");
        std::string name = a.pos[0].j().get<std::string>();
        Args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
        for (const Value& v : items) {
          AFD_ASSIGN_OR_RETURN(Value r, apply_filter(line, name, v, rest));
          out.push_back(std::move(r));
        }
      }
      return to_list(out);
    }
    // select / reject / selectattr / rejectattr
    bool by_attr = f == "selectattr" || f == "rejectattr";
    bool want = f == "select" || f == "selectattr";
    size_t t0 = by_attr ? 1 : 0;  // index of the test name
    if (by_attr) {
      if (a.pos.empty() || !a.pos[0].j().is_string()) return error(line, f + "() needs an attribute name");
      attribute = a.pos[0].j().get<std::string>();
    }
    std::string test;
    if (a.pos.size() > t0) {
      if (!a.pos[t0].j().is_string()) return error(line, f + "() test name must be a string");
      test = a.pos[t0].j().get<std::string>();
    }
    Args targs;
    if (a.pos.size() > t0 + 1) targs.pos.assign(a.pos.begin() + static_cast<long>(t0) + 1, a.pos.end());
    std::vector<Value> out;
    for (const Value& v : items) {
      Value probe = v;
      if (by_attr) {
        AFD_ASSIGN_OR_RETURN(probe, attr_path(line, v, attribute));
      }
      bool r;
      if (test.empty()) r = truthy(probe);
      else {
        AFD_ASSIGN_OR_RETURN(r, run_test(line, test, probe, targs));
      }
      if (r == want) out.push_back(v);
    }
    return to_list(out);
  }

  // ---- tests --------------------------------------------------------------------------
  [[gnu::noinline]] Result<bool> run_test(int line, const std::string& t, const Value& x, const Args& a) {
    const json& j = x.j();
    if (t == "defined") return !x.undef();
    if (t == "undefined") return x.undef();
    const Value* arg = a.get(0, "other");
    if (t == "none") return !x.undef() && !x.callable() && j.is_null();
    if (t == "boolean") return !x.undef() && j.is_boolean();
    if (t == "true") return !x.undef() && j.is_boolean() && j.get<bool>();
    if (t == "false") return !x.undef() && j.is_boolean() && !j.get<bool>();
    if (t == "string") return !x.undef() && j.is_string();
    if (t == "number") return !x.undef() && numeric(j);
    if (t == "integer") return !x.undef() && j.is_number_integer();
    if (t == "float") return !x.undef() && j.is_number_float();
    if (t == "mapping") return !x.undef() && j.is_object();
    if (t == "iterable") return x.undef() || j.is_array() || j.is_string() || j.is_object();
    if (t == "sequence") return x.undef() || j.is_array() || j.is_string() || j.is_object();  // Undefined has len()
    if (t == "callable") return x.undef() || x.callable();  // Undefined defines __call__
    if (t == "lower" || t == "upper") {  // str(x).islower() / isupper()
      AFD_ASSIGN_OR_RETURN(std::string s, to_str(line, x));
      AFD_ASSIGN_OR_RETURN(Value r, call_method(line, Value::of(json(std::move(s))), t == "lower" ? "islower" : "isupper", Args{}));
      return r.j().get<bool>();
    }
    if (t == "even" || t == "odd" || t == "divisibleby") {
      if (x.undef()) return undefined_error(line, x);
      if (!numeric(j)) return error(line, "test '" + t + "' needs a number");
      if (t == "divisibleby") {
        if (!arg || !numeric(arg->j())) return error(line, "divisibleby needs a number");
        if (is_float(j) || is_float(arg->j())) {
          double q = as_double(arg->j());
          if (q == 0) return error(line, "division by zero");
          return std::fmod(as_double(j), q) == 0;
        }
        __int128 q = as_int(arg->j());
        if (q == 0) return error(line, "division by zero");
        return as_int(j) % q == 0;
      }
      if (is_float(j)) return std::fmod(j.get<double>(), 2.0) == (t == "even" ? 0.0 : 1.0);
      __int128 v = as_int(j);
      return (v % 2 == 0) == (t == "even");
    }
    if (t == "equalto" || t == "eq" || t == "==") return arg && x.undef() == arg->undef() && py_equal(j, arg->j());
    if (t == "ne" || t == "!=") return !(arg && x.undef() == arg->undef() && py_equal(j, arg->j()));
    if (t == "sameas") {
      if (!arg) return error(line, "sameas needs an argument");
      if (x.undef() || arg->undef()) return x.undef() && arg->undef() && x.p == arg->p;
      const json& b = arg->j();
      if (j.is_null() || b.is_null()) return j.is_null() && b.is_null();
      if (j.is_boolean() || b.is_boolean()) return j.is_boolean() && b.is_boolean() && j == b;
      return &j == &b;
    }
    if (t == "lt" || t == "lessthan" || t == "<" || t == "le" || t == "<=" || t == "gt" || t == "greaterthan" ||
        t == ">" || t == "ge" || t == ">=") {
      if (!arg) return error(line, "test '" + t + "' needs an argument");
      std::string op = t == "lt" || t == "lessthan" ? "<" : t == "le" ? "<=" : t == "gt" || t == "greaterthan" ? ">" : t == "ge" ? ">=" : t;
      AFD_ASSIGN_OR_RETURN(Value r, compare(line, op, x, *arg));
      return r.j().get<bool>();
    }
    if (t == "in") {
      if (!arg) return error(line, "test 'in' needs an argument");
      return contains(line, *arg, x);
    }
    return error(line, "no test named '" + t + "'");
  }

  // ---- operators ----------------------------------------------------------------------
  Result<bool> contains(int line, const Value& hay, const Value& needle) {
    if (hay.undef()) return false;
    const json& h = hay.j();
    const json& n = needle.j();
    if (h.is_array()) {
      AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(h.size())));
      for (const json& x : h)
        if (!needle.undef() && py_equal(x, n)) return true;
      return false;
    }
    if (h.is_object()) {
      if (n.is_structured()) return error(line, std::string("unhashable type: '") + type_name(needle) + "'");
      return !needle.undef() && n.is_string() && h.contains(n.get_ref<const std::string&>());
    }
    if (h.is_string()) {
      if (needle.undef() || !n.is_string())
        return error(line, "'in <string>' requires string as left operand, not " + std::string(type_name(needle)));
      AFD_RETURN_IF_ERROR(scan(line, h.get_ref<const std::string&>().size()));
      return h.get_ref<const std::string&>().find(n.get_ref<const std::string&>()) != std::string::npos;
    }
    return error(line, "argument of type '" + std::string(type_name(hay)) + "' is not iterable");
  }

  Result<Value> compare(int line, const std::string& op, const Value& a, const Value& b) {
    if (a.undef()) return undefined_error(line, a);
    if (b.undef()) return undefined_error(line, b);
    bool ok = true;
    bool r = op == "<"    ? py_less(a.j(), b.j(), &ok)
             : op == ">"  ? py_less(b.j(), a.j(), &ok)
             : op == "<=" ? !py_less(b.j(), a.j(), &ok)
                          : !py_less(a.j(), b.j(), &ok);
    if (!ok)
      return error(line, "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
                             type_name(b) + "'");
    return truth(r);
  }

  Result<Value> repeat(int line, const Value& seq, const Value& times) {
    __int128 n = as_int(times.j());
    if (n < 0) n = 0;
    const json& s = seq.j();
    if (s.empty() || (s.is_string() && s.get_ref<const std::string&>().empty()))
      return Value::of(s.is_string() ? json("") : json::array());
    if (s.is_string()) {
      const std::string& str = s.get_ref<const std::string&>();
      if (static_cast<double>(n) * static_cast<double>(str.size()) > static_cast<double>(lim_.max_output_bytes))
        return limit_error(line, "a string would be longer than", "max_output_bytes",
                           static_cast<int64_t>(lim_.max_output_bytes));
      std::string r;
      r.reserve(static_cast<size_t>(n) * str.size());
      for (__int128 i = 0; i < n; ++i) r += str;
      return str_value(line, std::move(r));
    }
    if (static_cast<double>(n) * static_cast<double>(s.size()) > static_cast<double>(lim_.max_steps))
      return limit_error(line, "a list would have more items than", "max_steps", lim_.max_steps);
    json r = json::array();
    for (__int128 i = 0; i < n; ++i)
      for (const json& x : s) {
        AFD_RETURN_IF_ERROR(admit(line, x, 1));
        r.push_back(x);
      }
    return Value::of(std::move(r));
  }

  [[gnu::noinline]] Result<Value> eval_binary(const Expr& e) {
    const std::string& op = e.name;
    AFD_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
    if (op == "and") {
      if (!truthy(a)) return a;
      return eval(*e.args[1]);
    }
    if (op == "or") {
      if (truthy(a)) return a;
      return eval(*e.args[1]);
    }
    AFD_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
    return binary_op(e, std::move(a), std::move(b));
  }

  // The operators other than and/or, on evaluated operands (kept out of eval_binary's
  // frame, which expression nesting stacks up).
  [[gnu::noinline]] Result<Value> binary_op(const Expr& e, Value a, Value b) {
    const std::string& op = e.name;
    const json &x = a.j(), &y = b.j();
    if (op == "==" || op == "!=") {
      bool eq = a.callable() || b.callable() ? a.method == b.method && a.macro == b.macro && a.p == b.p
                                             : a.undef() == b.undef() && py_equal(x, y);
      return truth(op == "==" ? eq : !eq);
    }
    if (op == "in" || op == "notin") {
      AFD_ASSIGN_OR_RETURN(bool r, contains(e.line, b, a));
      return truth(op == "in" ? r : !r);
    }
    if (op == "~") {
      std::string s;
      AFD_RETURN_IF_ERROR(append_str(e.line, a, &s));
      AFD_RETURN_IF_ERROR(append_str(e.line, b, &s));
      return Value::of(json(std::move(s)));
    }
    if (a.undef()) return undefined_error(e.line, a);
    if (b.undef()) return undefined_error(e.line, b);
    if (op == "<" || op == ">" || op == "<=" || op == ">=") return compare(e.line, op, a, b);
    if (op == "+") {
      if (x.is_string() && y.is_string()) {
        const std::string &p = x.get_ref<const std::string&>(), &q = y.get_ref<const std::string&>();
        AFD_RETURN_IF_ERROR(string_size(e.line, p.size() + q.size()));
        std::string r;
        r.reserve(p.size() + q.size());
        r += p;
        r += q;
        return Value::of(json(std::move(r)));
      }
      if (x.is_array() && y.is_array()) {
        AFD_RETURN_IF_ERROR(admit(e.line, y, 0));
        AFD_ASSIGN_OR_RETURN(json r, take(e.line, std::move(a), 0));  // x dangles from here
        for (const json& v : y) r.push_back(v);
        return Value::of(std::move(r));
      }
    }
    if (op == "*") {
      if ((x.is_string() || x.is_array()) && (y.is_number_integer() || y.is_boolean())) return repeat(e.line, a, b);
      if ((y.is_string() || y.is_array()) && (x.is_number_integer() || x.is_boolean())) return repeat(e.line, b, a);
    }
    if (!numeric(x) || !numeric(y))
      return error(e.line, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    bool ints = !is_float(x) && !is_float(y);
    if (ints && op != "/") {
      __int128 p = as_int(x), q = as_int(y), r = 0;
      if (op == "+") r = p + q;
      else if (op == "-") r = p - q;
      else if (op == "*") r = p * q;
      else if (op == "**") {
        if (q < 0 && p == 0) return error(e.line, "0.0 cannot be raised to a negative power");
        if (q < 0) return Value::of(json(std::pow(static_cast<double>(p), static_cast<double>(q))));
        r = 1;
        for (__int128 k = 0; k < q; ++k) {
          r *= p;
          if (r > INT64_MAX || r < INT64_MIN) return error(e.line, "integer overflow in **");
          if (r == 0 || r == 1) break;
          if (r == -1) {
            r = ((q - k - 1) % 2 == 0) ? -1 : 1;
            break;
          }
        }
      } else {
        if (q == 0) return error(e.line, "integer division or modulo by zero");
        __int128 quo = p / q, rem = p % q;
        if (rem != 0 && ((rem < 0) != (q < 0))) {
          quo -= 1;
          rem += q;
        }
        r = op == "//" ? quo : rem;
      }
      if (r > INT64_MAX || r < INT64_MIN) return error(e.line, "integer overflow in " + op);
      return Value::of(json(static_cast<int64_t>(r)));
    }
    double p = as_double(x), q = as_double(y);
    if (op == "+") return Value::of(json(p + q));
    if (op == "-") return Value::of(json(p - q));
    if (op == "*") return Value::of(json(p * q));
    if (op == "**") {
      if (p == 0 && q < 0) return error(e.line, "0.0 cannot be raised to a negative power");
      double r = std::pow(p, q);
      if (std::isinf(r) && std::isfinite(p) && std::isfinite(q)) return error(e.line, "numerical result out of range");
      return Value::of(json(r));
    }
    if (q == 0) return error(e.line, "division by zero");
    if (op == "/") return Value::of(json(p / q));
    // Python's float divmod: the remainder takes the divisor's sign (+0.0 or -0.0 when zero).
    double m = std::fmod(p, q);
    if (m != 0 && ((m < 0) != (q < 0))) m += q;
    if (m == 0) m = std::copysign(0.0, q);
    if (op == "%") return Value::of(json(m));
    if (op == "//") {
      double d = std::floor((p - m) / q + 0.5);
      return Value::of(json(d == 0 ? std::copysign(0.0, p / q) : d));
    }
    return error(e.line, "unknown operator " + op);
  }

  const Limits& lim_;
  const Value true_, false_;  // shared results of comparisons and tests
  std::vector<Scope> scopes_;
  const std::shared_ptr<json> macro_placeholder_ = std::make_shared<json>();
  int64_t steps_ = 0;
  size_t alloc_ = 0;
  int depth_ = 0;
  int call_depth_ = 0;
};

}  // namespace

Result<std::string> Template::render(const json& context) const {
  if (!context.is_object()) return invalid_argument("chat template context must be an object");
  Evaluator ev(context, limits_);
  std::string out;
  try {
    AFD_RETURN_IF_ERROR(ev.check_context(context));
    auto f = ev.exec_list(body_, &out);
    if (!f.ok()) return f.status();
  } catch (const std::exception& ex) {  // nlohmann type errors on unexpected data shapes, bad_alloc
    return invalid_argument(std::string("chat template evaluation failed: ") + ex.what());
  }
  return out;
}

}  // namespace afd::serve::jinja
