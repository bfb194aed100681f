// Python's str operations over UTF-8 (jinja_pystr.h).
#include "serve/text/jinja_pystr.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <locale.h>
#include <wctype.h>

#include "serve/text/unicode.h"

namespace afd::serve::jinja {

namespace {

// The built-in C.UTF-8 locale's character classes; null where that locale is missing.
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
std::string lower_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

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

bool cp_is_upper(char32_t c) {
  if (c < 0x80) return std::isupper(static_cast<int>(c)) != 0;
  return utf8_ctype() && iswupper_l(static_cast<wint_t>(c), utf8_ctype());
}
bool cp_is_lower(char32_t c) {
  if (c < 0x80) return std::islower(static_cast<int>(c)) != 0;
  return utf8_ctype() && iswlower_l(static_cast<wint_t>(c), utf8_ctype());
}
bool cp_is_cased(char32_t c) { return cp_is_upper(c) || cp_is_lower(c); }

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
    if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == '.' || ch == 'e' || ch == '+' || ch == '-'))
      return false;
  char* end = nullptr;
  *out = std::strtod(c.c_str(), &end);
  return end && *end == '\0' && end != c.c_str();
}

}  // namespace afd::serve::jinja
