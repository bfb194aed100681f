#include "serve/text/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "serve/text/unicode.h"

namespace afd::serve::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string where(int line) { return "chat template line " + std::to_string(line); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One escape sequence of a string literal starting at s[j] == '\\', decoded as Python's
// unicode-escape codec does (jinja2 decodes literals that way): \\ \' \" \a \b \f \n
// \r \t \v, octal \ooo, \xhh, \uhhhh, \Uhhhhhhhh. Unknown escapes keep the backslash.
// Returns the index of the escape's last character.
size_t unescape(const std::string& s, size_t j, std::string* v) {
  char e = s[j + 1];
  switch (e) {
    case 'n': *v += '\n'; return j + 1;
    case 't': *v += '\t'; return j + 1;
    case 'r': *v += '\r'; return j + 1;
    case 'a': *v += '\a'; return j + 1;
    case 'b': *v += '\b'; return j + 1;
    case 'f': *v += '\f'; return j + 1;
    case 'v': *v += '\v'; return j + 1;
    case '\\': *v += '\\'; return j + 1;
    case '\'': *v += '\''; return j + 1;
    case '"': *v += '"'; return j + 1;
    case '\n': return j + 1;  // line continuation
    default: break;
  }
  if (e >= '0' && e <= '7') {
    uint32_t cp = 0;
    size_t k = j + 1;
    for (int n = 0; n < 3 && k < s.size() && s[k] >= '0' && s[k] <= '7'; ++n, ++k) cp = cp * 8 + (s[k] - '0');
    utf8_append(v, cp);
    return k - 1;
  }
  int width = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
  if (width > 0 && j + 1 + width < s.size()) {
    uint32_t cp = 0;
    bool ok = true;
    for (int n = 0; n < width; ++n) {
      int h = hex_value(s[j + 2 + n]);
      if (h < 0) ok = false;
      cp = cp * 16 + static_cast<uint32_t>(std::max(h, 0));
    }
    if (ok && cp <= 0x10FFFF) {
      utf8_append(v, cp);
      return j + 1 + width;
    }
  }
  *v += '\\';
  *v += e;
  return j + 1;
}

}  // namespace

// Index of the closing `}}` / `%}` of a tag whose body starts at b: the first one outside
// string literals and brackets, as jinja2's lexer balances them ({{ {'a': {'b': 1}} }}).
size_t find_tag_end(const std::string& t, size_t b, char kind) {
  int depth = 0;
  for (size_t i = b; i < t.size(); ++i) {
    char c = t[i];
    if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < t.size() && t[j] != c) j += t[j] == '\\' ? 2 : 1;
      if (j >= t.size()) return std::string::npos;
      i = j;
      continue;
    }
    if (depth == 0 && c == (kind == '{' ? '}' : '%') && i + 1 < t.size() && t[i + 1] == '}') return i;
    if (c == '(' || c == '[' || c == '{') ++depth;
    else if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
  }
  return std::string::npos;
}

// As jinja2's lexer: newlines (\r\n, \r, \n) become \n and one trailing newline is
// dropped (keep_trailing_newline is off in transformers).
std::string normalize_newlines(const std::string& s) {
  std::string t;
  t.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      t.push_back('\n');
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      t.push_back(s[i]);
    }
  }
  if (!t.empty() && t.back() == '\n') t.pop_back();
  return t;
}

Result<std::vector<Chunk>> split_chunks(const std::string& source) {
  const std::string t = normalize_newlines(source);
  std::vector<Chunk> out;
  size_t i = 0;
  int line = 1;
  bool strip_next_ws = false;   // previous tag ended with '-'
  bool trim_next_nl = false;    // previous tag was a block/comment (trim_blocks)
  while (i <= t.size()) {
    size_t open = t.find('{', i);
    while (open != std::string::npos && open + 1 < t.size() && t[open + 1] != '{' && t[open + 1] != '%' &&
           t[open + 1] != '#')
      open = t.find('{', open + 1);
    if (open != std::string::npos && open + 1 >= t.size()) open = std::string::npos;
    std::string text = t.substr(i, open == std::string::npos ? std::string::npos : open - i);
    char kind = open == std::string::npos ? 0 : t[open + 1];
    bool left_minus = kind && open + 2 < t.size() && t[open + 2] == '-';
    bool left_plus = kind && open + 2 < t.size() && t[open + 2] == '+';
    // Whitespace control on the text before this tag.
    bool starts_line = i == 0 || t[i - 1] == '\n';
    if (strip_next_ws) {
      size_t k = 0;
      while (k < text.size() && is_ws(text[k])) ++k;
      text.erase(0, k);
    } else if (trim_next_nl && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      starts_line = true;
    }
    if (left_minus) {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if ((kind == '%' || kind == '#') && !left_plus) {
      // lstrip_blocks: drop spaces/tabs between the start of the line and the tag.
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      if (k > 0 ? text[k - 1] == '\n' : starts_line) text.erase(k);
    }
    if (!text.empty()) out.push_back({ChunkKind::text, text, line});
    for (char c : t.substr(i, open == std::string::npos ? std::string::npos : open - i))
      if (c == '\n') ++line;
    if (open == std::string::npos) break;
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t body_start = open + 2 + ((left_minus || left_plus) ? 1 : 0);
    size_t end = kind == '#' ? t.find(close, body_start) : find_tag_end(t, body_start, kind);
    if (end == std::string::npos && kind == '#' && body_start >= t.size()) break;  // jinja2: `{#` at the very end is an empty comment
    if (end == std::string::npos) return invalid_argument(where(line) + ": unclosed tag");
    bool right_minus = end > body_start && t[end - 1] == '-';
    std::string body = t.substr(body_start, end - body_start - (right_minus ? 1 : 0));
    if (kind == '{') out.push_back({ChunkKind::expr, body, line});
    else if (kind == '%') out.push_back({ChunkKind::stmt, body, line});
    for (char c : t.substr(open, end + 2 - open))
      if (c == '\n') ++line;
    strip_next_ws = right_minus;
    trim_next_nl = kind != '{';
    i = end + 2;
  }
  return out;
}

Result<std::vector<Tok>> tokenize(const std::string& s, int line) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (is_ws(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({TokKind::name, s.substr(i, j - i)});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      auto digits = [&] {
        while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      };
      digits();
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        digits();
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {  // exponent: 1e5, 2.5E-3
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          digits();
        }
      }
      std::string num;
      for (size_t k = i; k < j; ++k)
        if (s[k] != '_') num += s[k];
      out.push_back({is_float ? TokKind::number : TokKind::integer, num});
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          j = unescape(s, j, &v);
        } else {
          v += s[j];
        }
      }
      if (j >= s.size()) return invalid_argument("chat template line " + std::to_string(line) + ": unterminated string");
      out.push_back({TokKind::string, v});
      i = j + 1;
      continue;
    }
    static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                 "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
    bool found = false;
    for (const char* op : kOps) {
      size_t n = std::char_traits<char>::length(op);
      if (s.compare(i, n, op) == 0) {
        out.push_back({TokKind::op, op});
        i += n;
        found = true;
        break;
      }
    }
    if (!found)
      return invalid_argument("chat template line " + std::to_string(line) + ": unexpected character '" +
                              std::string(1, c) + "'");
  }
  out.push_back({TokKind::end, ""});
  return out;
}

}  // namespace afd::serve::jinja
