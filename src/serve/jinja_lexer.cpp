#include "serve/jinja_lexer.h"

#include <cctype>

namespace afd::serve::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string where(int line) { return "chat template line " + std::to_string(line); }

}  // namespace

Result<std::vector<Chunk>> split_chunks(const std::string& t) {
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
    } else if (trim_next_nl && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
      text.erase(0, 2);
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
    size_t end = t.find(close, body_start);
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
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
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
          char e = s[++j];
          switch (e) {
            case 'n': v += '\n'; break;
            case 't': v += '\t'; break;
            case 'r': v += '\r'; break;
            case '\\': v += '\\'; break;
            case '\'': v += '\''; break;
            case '"': v += '"'; break;
            default: v += '\\'; v += e;
          }
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
