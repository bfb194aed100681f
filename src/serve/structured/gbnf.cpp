#include "serve/structured/gbnf.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "serve/structured/utf8_ranges.h"
#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

// Parentheses nested deeper than this are refused (the parser recurses once per level).
constexpr int32_t kMaxNesting = 128;
// Largest repetition count accepted in {m,n}.
constexpr int64_t kMaxRepeat = 100000;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

class Parser {
 public:
  Parser(std::string_view text, const GrammarLimits& limits) : t_(text), limits_(limits) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < t_.size(); ++i)
      if (t_[i] == '\n') line_starts_.push_back(i + 1);
  }

  Result<std::shared_ptr<const Grammar>> parse() {
    if (static_cast<int64_t>(t_.size()) > limits_.max_text_bytes)
      return invalid_argument("the grammar has " + std::to_string(t_.size()) + " bytes, more than the limit " +
                              std::to_string(limits_.max_text_bytes));
    skip_space(true);
    while (pos_ < t_.size()) {
      const size_t name_pos = pos_;
      std::string_view name = parse_name();
      if (name.empty()) return error(pos_, "expected a rule name, found " + describe(pos_));
      skip_space(false);
      if (t_.substr(pos_, 3) != "::=")
        return error(pos_, "expected '::=' after the rule name '" + std::string(name) + "'");
      pos_ += 3;
      skip_space(true);
      AFD_ASSIGN_OR_RETURN(int32_t r, rule_index(name, name_pos));
      GrammarRule& rule = rules_[r];
      if (rule.expr >= 0)
        return error(name_pos, "rule '" + std::string(name) + "' is defined twice (first at line " +
                                   std::to_string(rule.line) + ")");
      auto [line, column] = line_column(name_pos);
      rules_[r].line = line;
      rules_[r].column = column;
      AFD_ASSIGN_OR_RETURN(int32_t body, parse_alternates(0));
      rules_[r].expr = body;
      skip_space(false);
      if (pos_ < t_.size() && t_[pos_] != '\n' && t_[pos_] != '\r') {
        if (t_.substr(pos_, 3) == "::=")
          return error(pos_, "expected a newline before the definition that starts here");
        return error(pos_, "expected the end of the line, found " + describe(pos_));
      }
      skip_space(true);
    }
    auto root = names_.find("root");
    if (root == names_.end()) return invalid_argument("the grammar has no rule named 'root'");
    return Grammar::make(std::move(rules_), std::move(exprs_), root->second, limits_);
  }

 private:
  std::pair<int32_t, int32_t> line_column(size_t pos) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int32_t>(line), static_cast<int32_t>(pos - line_starts_[line - 1] + 1)};
  }
  Status error(size_t pos, const std::string& what) const {
    auto [line, column] = line_column(pos);
    return invalid_argument("line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + what);
  }
  std::string describe(size_t pos) const {
    if (pos >= t_.size()) return "the end of the grammar";
    const unsigned char c = static_cast<unsigned char>(t_[pos]);
    if (c == '\n' || c == '\r') return "the end of the line";
    std::string out;
    if (c < 0x20 || c >= 0x7F) {
      static const char* kHex = "0123456789ABCDEF";
      out = "byte 0x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back('\'');
      out.push_back(static_cast<char>(c));
      out.push_back('\'');
    }
    return out;
  }

  // Spaces, tabs and comments; newlines too when newline_ok.
  void skip_space(bool newline_ok) {
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < t_.size() && t_[pos_] != '\n' && t_[pos_] != '\r') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  std::string_view parse_name() {
    const size_t begin = pos_;
    while (pos_ < t_.size() && is_name_char(t_[pos_])) ++pos_;
    return t_.substr(begin, pos_ - begin);
  }
  Result<int32_t> rule_index(std::string_view name, size_t pos) {
    auto it = names_.find(std::string(name));
    if (it != names_.end()) return it->second;
    if (static_cast<int64_t>(rules_.size()) >= limits_.max_rules)
      return error(pos, "the grammar has more than " + std::to_string(limits_.max_rules) + " rules");
    const int32_t r = static_cast<int32_t>(rules_.size());
    names_.emplace(std::string(name), r);
    GrammarRule rule;
    rule.name = std::string(name);
    std::tie(rule.ref_line, rule.ref_column) = line_column(pos);
    rules_.push_back(std::move(rule));
    return r;
  }
  Result<int32_t> add(GrammarExpr e, size_t pos) {
    if (static_cast<int64_t>(exprs_.size()) >= limits_.max_elements)
      return error(pos, "the grammar has more than " + std::to_string(limits_.max_elements) + " elements");
    std::tie(e.line, e.column) = line_column(pos);
    exprs_.push_back(std::move(e));
    return static_cast<int32_t>(exprs_.size() - 1);
  }
  Result<int32_t> add_bytes(const ByteSet& s, size_t pos) {
    GrammarExpr e;
    e.kind = ExprKind::bytes;
    e.bytes = s;
    return add(std::move(e), pos);
  }
  Result<int32_t> add_list(ExprKind kind, std::vector<int32_t> children, size_t pos) {
    if (children.size() == 1) return children[0];
    GrammarExpr e;
    e.kind = kind;
    e.children = std::move(children);
    return add(std::move(e), pos);
  }

  // alternatives: sequence ('|' sequence)*. depth 0: a rule body (a newline ends it unless the next
  // line starts with '|'); deeper: inside parentheses.
  Result<int32_t> parse_alternates(int32_t depth) {
    const size_t begin = pos_;
    std::vector<int32_t> alts;
    AFD_ASSIGN_OR_RETURN(int32_t first, parse_sequence(depth));
    alts.push_back(first);
    while (true) {
      const size_t save = pos_;
      skip_space(true);
      if (pos_ < t_.size() && t_[pos_] == '|') {
        ++pos_;
        skip_space(true);
        AFD_ASSIGN_OR_RETURN(int32_t next, parse_sequence(depth));
        alts.push_back(next);
      } else {
        pos_ = save;
        break;
      }
    }
    return add_list(ExprKind::alt, std::move(alts), begin);
  }

  Result<int32_t> parse_sequence(int32_t depth) {
    const size_t begin = pos_;
    std::vector<int32_t> items;
    while (true) {
      skip_space(depth > 0);
      if (pos_ >= t_.size()) break;
      const char c = t_[pos_];
      if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
      const size_t item_pos = pos_;
      AFD_ASSIGN_OR_RETURN(int32_t item, parse_element(depth));
      // Postfix repetitions, each applying to what precedes it.
      while (true) {
        skip_space(depth > 0);
        if (pos_ >= t_.size()) break;
        const char op = t_[pos_];
        int64_t min = 0, max = 0;
        if (op == '*') {
          min = 0, max = -1, ++pos_;
        } else if (op == '+') {
          min = 1, max = -1, ++pos_;
        } else if (op == '?') {
          min = 0, max = 1, ++pos_;
        } else if (op == '{') {
          AFD_RETURN_IF_ERROR(parse_braces(&min, &max));
        } else {
          break;
        }
        GrammarExpr e;
        e.kind = ExprKind::repeat;
        e.min = static_cast<int32_t>(min);
        e.max = static_cast<int32_t>(max);
        e.children = {item};
        AFD_ASSIGN_OR_RETURN(item, add(std::move(e), item_pos));
      }
      items.push_back(item);
    }
    if (items.empty()) {
      GrammarExpr e;
      e.kind = ExprKind::seq;
      return add(std::move(e), begin);
    }
    return add_list(ExprKind::seq, std::move(items), begin);
  }

  Status parse_braces(int64_t* min, int64_t* max) {
    const size_t open = pos_++;
    auto number = [&](int64_t* v) -> Status {
      const size_t begin = pos_;
      *v = 0;
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
        *v = *v * 10 + (t_[pos_++] - '0');
        if (*v > kMaxRepeat) return error(begin, "repetition count larger than " + std::to_string(kMaxRepeat));
      }
      return Status();
    };
    skip_space(false);
    const bool has_min = pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9';
    AFD_RETURN_IF_ERROR(number(min));
    skip_space(false);
    if (pos_ < t_.size() && t_[pos_] == '}') {
      if (!has_min) return error(open, "expected a number in '{}'");
      *max = *min;
      ++pos_;
      return Status();
    }
    if (pos_ >= t_.size() || t_[pos_] != ',')
      return error(pos_, "expected ',' or '}' in a repetition, found " + describe(pos_));
    ++pos_;
    skip_space(false);
    if (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
      AFD_RETURN_IF_ERROR(number(max));
      if (*max < *min)
        return error(open, "repetition {" + std::to_string(*min) + "," + std::to_string(*max) +
                               "} has a maximum below its minimum");
    } else {
      if (!has_min) return error(open, "repetition '{,}' has no bound");
      *max = -1;
    }
    skip_space(false);
    if (pos_ >= t_.size() || t_[pos_] != '}')
      return error(pos_, "expected '}' to close the repetition, found " + describe(pos_));
    ++pos_;
    return Status();
  }

  Result<int32_t> parse_element(int32_t depth) {
    const size_t begin = pos_;
    const char c = t_[pos_];
    if (c == '"') return parse_literal();
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return add_code_points({{0, 0x10FFFF}}, begin);
    }
    if (c == '(') {
      if (depth + 1 > kMaxNesting)
        return error(pos_, "parentheses nested more than " + std::to_string(kMaxNesting) + " deep");
      ++pos_;
      skip_space(true);
      AFD_ASSIGN_OR_RETURN(int32_t inner, parse_alternates(depth + 1));
      skip_space(true);
      if (pos_ >= t_.size() || t_[pos_] != ')')
        return error(pos_, "expected ')' to close the '(' at " + where(begin) + ", found " + describe(pos_));
      ++pos_;
      return inner;
    }
    if (is_name_char(c)) {
      std::string_view name = parse_name();
      const size_t after = pos_;
      skip_space(false);
      if (t_.substr(pos_, 3) == "::=")
        return error(begin, "expected a newline before the definition of rule '" + std::string(name) + "'");
      pos_ = after;
      AFD_ASSIGN_OR_RETURN(int32_t r, rule_index(name, begin));
      GrammarExpr e;
      e.kind = ExprKind::ref;
      e.rule = r;
      return add(std::move(e), begin);
    }
    return error(pos_, "unexpected " + describe(pos_));
  }
  std::string where(size_t pos) const {
    auto [line, column] = line_column(pos);
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }

  // One code point of a literal or class: an escape or a UTF-8 sequence.
  Result<uint32_t> parse_char() {
    const size_t begin = pos_;
    const unsigned char c = static_cast<unsigned char>(t_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= t_.size()) return error(begin, "escape '\\' at the end of the grammar");
      const char e = t_[pos_ + 1];
      pos_ += 2;
      int digits = 0;
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 'r': return uint32_t{'\r'};
        case 't': return uint32_t{'\t'};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^': return uint32_t(static_cast<unsigned char>(e));
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: return error(begin, "unknown escape '\\" + std::string(1, e) + "'");
      }
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i, ++pos_) {
        const char h = pos_ < t_.size() ? t_[pos_] : '\0';
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0)
          return error(begin, "escape '\\" + std::string(1, e) + "' needs " + std::to_string(digits) + " hex digits");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      if (v > 0x10FFFF) return error(begin, "code point past U+10FFFF");
      return v;
    }
    if (c < 0x80) {
      ++pos_;
      return uint32_t{c};
    }
    const int n = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (n == 0 || (c >= 0xF0 && n != 4)) return error(begin, "invalid UTF-8");
    if (pos_ + n > t_.size()) return error(begin, "invalid UTF-8");
    uint32_t v = c & (0xFF >> (n + 1));
    for (int i = 1; i < n; ++i) {
      const unsigned char k = static_cast<unsigned char>(t_[pos_ + i]);
      if ((k & 0xC0) != 0x80) return error(begin, "invalid UTF-8");
      v = (v << 6) | (k & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return error(begin, "invalid UTF-8");
    pos_ += n;
    return v;
  }

  Result<int32_t> parse_literal() {
    const size_t begin = pos_++;
    std::vector<int32_t> bytes;
    while (true) {
      if (pos_ >= t_.size() || t_[pos_] == '\n' || t_[pos_] == '\r')
        return error(begin, "string literal not closed on its line");
      if (t_[pos_] == '"') break;
      const size_t cp_pos = pos_;
      AFD_ASSIGN_OR_RETURN(uint32_t cp, parse_char());
      if (cp >= 0xD800 && cp <= 0xDFFF) return error(cp_pos, "a surrogate code point is not a character");
      std::string utf8;
      utf8_append(&utf8, cp);
      for (char b : utf8) {
        ByteSet s;
        s.set(static_cast<uint8_t>(b));
        AFD_ASSIGN_OR_RETURN(int32_t e, add_bytes(s, cp_pos));
        bytes.push_back(e);
      }
    }
    ++pos_;
    if (bytes.empty()) {
      GrammarExpr e;
      e.kind = ExprKind::seq;
      return add(std::move(e), begin);
    }
    return add_list(ExprKind::seq, std::move(bytes), begin);
  }

  Result<int32_t> parse_class() {
    const size_t begin = pos_++;
    bool negated = false;
    if (pos_ < t_.size() && t_[pos_] == '^') negated = true, ++pos_;
    std::vector<CodePointRange> ranges;
    while (true) {
      if (pos_ >= t_.size() || t_[pos_] == '\n' || t_[pos_] == '\r')
        return error(begin, "character class not closed on its line");
      if (t_[pos_] == ']') break;
      AFD_ASSIGN_OR_RETURN(uint32_t lo, parse_char());
      uint32_t hi = lo;
      if (pos_ + 1 < t_.size() && t_[pos_] == '-' && t_[pos_ + 1] != ']') {
        const size_t dash = pos_++;
        AFD_ASSIGN_OR_RETURN(hi, parse_char());
        if (hi < lo) return error(dash, "range end is below its start in the character class");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    ranges = normalize_code_points(std::move(ranges));
    if (negated) ranges = complement_code_points(ranges);
    return add_code_points(std::move(ranges), begin);
  }

  // One code point from ranges: ASCII as one byte set, the rest as UTF-8 byte-range sequences.
  Result<int32_t> add_code_points(std::vector<CodePointRange> ranges, size_t pos) {
    ranges = normalize_code_points(std::move(ranges));
    std::vector<ByteRangeSeq> seqs;
    ByteSet ascii;
    for (auto [lo, hi] : ranges) {
      if (lo < 0x80) ascii.set_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(std::min<uint32_t>(hi, 0x7F)));
      if (hi >= 0x80) utf8_sequences(std::max<uint32_t>(lo, 0x80), hi, &seqs);
    }
    std::vector<int32_t> alts;
    if (!ascii.empty() || seqs.empty()) {
      AFD_ASSIGN_OR_RETURN(int32_t e, add_bytes(ascii, pos));
      alts.push_back(e);
    }
    for (const ByteRangeSeq& seq : seqs) {
      std::vector<int32_t> items;
      for (auto [lo, hi] : seq) {
        ByteSet s;
        s.set_range(lo, hi);
        AFD_ASSIGN_OR_RETURN(int32_t e, add_bytes(s, pos));
        items.push_back(e);
      }
      AFD_ASSIGN_OR_RETURN(int32_t e, add_list(ExprKind::seq, std::move(items), pos));
      alts.push_back(e);
    }
    return add_list(ExprKind::alt, std::move(alts), pos);
  }

  std::string_view t_;
  const GrammarLimits& limits_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  std::vector<GrammarRule> rules_;
  std::vector<GrammarExpr> exprs_;
  std::unordered_map<std::string, int32_t> names_;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text, const GrammarLimits& limits) {
  return Parser(text, limits).parse();
}

}  // namespace afd::serve
