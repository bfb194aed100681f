#include "serve/structured/regex_gbnf.h"

#include <cctype>
#include <optional>
#include <vector>

#include "serve/structured/code_point_set.h"
#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

struct Node {
  enum class Kind { chars, seq, alt, repeat };
  Kind kind = Kind::seq;
  CodePointSet chars;       // chars: one of these
  std::vector<Node> items;  // seq, alt: the parts; repeat: the one repeated
  int64_t min = 0;
  std::optional<int64_t> max;  // repeat; none: unbounded
};

CodePointSet digit_set() { return CodePointSet::range('0', '9'); }
CodePointSet word_set() {
  CodePointSet s = CodePointSet::range('a', 'z');
  s.add('A', 'Z');
  s.add('0', '9');
  s.add('_', '_');
  return s;
}
CodePointSet space_set() {
  CodePointSet s = CodePointSet::range('\t', '\r');
  for (char32_t cp : {0x20, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF}) s.add(cp, cp);
  s.add(0x2000, 0x200A);
  return s;
}
CodePointSet dot_set() {
  CodePointSet s;
  for (char32_t cp : {char32_t{'\n'}, char32_t{'\r'}, char32_t{0x2028}, char32_t{0x2029}}) s.add(cp, cp);
  return s.complement();
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view p) : p_(p) {}

  // Top-level alternatives, each with its anchors.
  struct Branch {
    Node node;
    bool start_anchored = false;
    bool end_anchored = false;
  };
  Result<std::vector<Branch>> parse() {
    std::vector<Branch> branches;
    while (true) {
      Branch br;
      if (peek('^')) ++pos_, br.start_anchored = true;
      AFD_ASSIGN_OR_RETURN(br.node, parse_seq(0, &br.end_anchored));
      branches.push_back(std::move(br));
      if (pos_ >= p_.size()) break;
      if (p_[pos_] == ')') return error("unbalanced ')'");
      ++pos_;  // '|'
    }
    return branches;
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument("regex: " + what + " at offset " + std::to_string(pos_));
  }
  bool peek(char c) const { return pos_ < p_.size() && p_[pos_] == c; }
  bool starts_with(std::string_view s) const { return p_.substr(pos_, s.size()) == s; }

  Result<Node> parse_alt(int depth) {
    Node alt;
    alt.kind = Node::Kind::alt;
    while (true) {
      AFD_ASSIGN_OR_RETURN(Node seq, parse_seq(depth, nullptr));
      alt.items.push_back(std::move(seq));
      if (!peek('|')) break;
      ++pos_;
    }
    if (alt.items.size() == 1) return std::move(alt.items[0]);
    return alt;
  }

  // A sequence up to '|', ')' or the end. end_anchor: where a trailing '$' is allowed (top
  // level only), set when present.
  Result<Node> parse_seq(int depth, bool* end_anchor) {
    Node seq;
    seq.kind = Node::Kind::seq;
    while (pos_ < p_.size() && !peek('|') && !peek(')')) {
      char c = p_[pos_];
      if (c == '$') {
        bool at_end = pos_ + 1 == p_.size() || p_[pos_ + 1] == '|';
        if (!end_anchor || !at_end) return error("'$' is supported only at the end of the pattern");
        ++pos_;
        *end_anchor = true;
        break;
      }
      if (c == '^') return error("'^' is supported only at the start of the pattern");
      if (c == '*' || c == '+' || c == '?') return error("nothing to repeat before '" + std::string(1, c) + "'");
      Node atom;
      if (c == '(') {
        AFD_ASSIGN_OR_RETURN(atom, parse_group(depth));
      } else if (c == '[') {
        AFD_ASSIGN_OR_RETURN(atom, parse_class());
      } else if (c == '.') {
        ++pos_;
        atom.kind = Node::Kind::chars;
        atom.chars = dot_set();
      } else if (c == '\\') {
        AFD_ASSIGN_OR_RETURN(atom, parse_escape(false));
      } else {
        if (c == '{' && quantifier_ahead()) return error("nothing to repeat before '{'");
        atom.kind = Node::Kind::chars;
        atom.chars = CodePointSet::of(next_code_point());
      }
      AFD_ASSIGN_OR_RETURN(atom, parse_quantifier(std::move(atom)));
      seq.items.push_back(std::move(atom));
    }
    return seq;
  }

  char32_t next_code_point() {
    size_t len = 1;
    char32_t cp = utf8_decode(p_, pos_, &len);
    pos_ += len;
    return cp;
  }

  Result<Node> parse_group(int depth) {
    size_t start = pos_;
    if (depth + 1 > kMaxGroupDepth) return error("groups nest deeper than " + std::to_string(kMaxGroupDepth));
    ++pos_;  // '('
    if (starts_with("?:")) {
      pos_ += 2;
    } else if (starts_with("?=") || starts_with("?!")) {
      pos_ = start;
      return error("lookahead is not supported");
    } else if (starts_with("?<=") || starts_with("?<!")) {
      pos_ = start;
      return error("lookbehind is not supported");
    } else if (starts_with("?<")) {
      size_t close = p_.find('>', pos_);
      if (close == std::string_view::npos) return error("unterminated group name");
      pos_ = close + 1;
    } else if (peek('?')) {
      return error("group modifiers and flags ('(?...') are not supported");
    }
    AFD_ASSIGN_OR_RETURN(Node inner, parse_alt(depth + 1));
    if (!peek(')')) {
      pos_ = start;
      return error("unbalanced '('");
    }
    ++pos_;
    return inner;
  }

  // Whether a {m}, {m,} or {m,n} quantifier starts at pos_.
  bool quantifier_ahead() const {
    size_t i = pos_ + 1;
    size_t digits = 0;
    while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') ++i, ++digits;
    if (digits == 0) return false;
    if (i < p_.size() && p_[i] == '}') return true;
    if (i >= p_.size() || p_[i] != ',') return false;
    ++i;
    while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') ++i;
    return i < p_.size() && p_[i] == '}';
  }

  Result<int64_t> parse_count() {
    int64_t v = 0;
    while (peek('0') || (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9')) {
      v = v * 10 + (p_[pos_] - '0');
      ++pos_;
      if (v > GbnfBuilder::kMaxRepetition) {
        return error("a repetition count above the " + std::to_string(GbnfBuilder::kMaxRepetition) + " supported");
      }
    }
    return v;
  }

  Result<Node> parse_quantifier(Node atom) {
    if (pos_ >= p_.size()) return atom;
    Node rep;
    rep.kind = Node::Kind::repeat;
    char c = p_[pos_];
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      ++pos_;
      rep.min = 1;
    } else if (c == '?') {
      ++pos_;
      rep.max = 1;
    } else if (c == '{' && quantifier_ahead()) {
      ++pos_;
      AFD_ASSIGN_OR_RETURN(rep.min, parse_count());
      if (peek('}')) {
        rep.max = rep.min;
      } else {
        ++pos_;  // ','
        if (!peek('}')) {
          AFD_ASSIGN_OR_RETURN(int64_t hi, parse_count());
          if (hi < rep.min) return error("{m,n} with m > n");
          rep.max = hi;
        }
      }
      ++pos_;  // '}'
    } else {
      return atom;
    }
    if (peek('?')) ++pos_;  // lazy: the same language
    if (pos_ < p_.size() && (peek('*') || peek('+') || peek('?') || (peek('{') && quantifier_ahead()))) {
      return error("nothing to repeat (a quantifier after a quantifier)");
    }
    rep.items.push_back(std::move(atom));
    return rep;
  }

  Result<uint32_t> hex_digits(size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i, ++pos_) {
      if (pos_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[pos_]))) {
        return error("expected " + std::to_string(n) + " hex digits");
      }
      char h = p_[pos_];
      v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }

  // An escape at pos_ ('\'); in_class: inside [...] (where \b is U+0008).
  Result<Node> parse_escape(bool in_class) {
    size_t start = pos_;
    ++pos_;
    if (pos_ >= p_.size()) return error("a pattern that ends with '\\'");
    char c = p_[pos_];
    Node n;
    n.kind = Node::Kind::chars;
    auto one = [&](char32_t cp) {
      n.chars = CodePointSet::of(cp);
      return n;
    };
    ++pos_;
    switch (c) {
      case 'd': n.chars = digit_set(); return n;
      case 'D': n.chars = digit_set().complement(); return n;
      case 'w': n.chars = word_set(); return n;
      case 'W': n.chars = word_set().complement(); return n;
      case 's': n.chars = space_set(); return n;
      case 'S': n.chars = space_set().complement(); return n;
      case 't': return one('\t');
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'b':
        if (in_class) return one('\b');
        pos_ = start;
        return error("word boundaries (\\b) are not supported");
      case 'B': pos_ = start; return error("word boundaries (\\B) are not supported");
      case '0':
        if (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9') {
          pos_ = start;
          return error("octal escapes are not supported");
        }
        return one(0);
      case 'x': {
        AFD_ASSIGN_OR_RETURN(uint32_t v, hex_digits(2));
        return one(v);
      }
      case 'u': {
        uint32_t v = 0;
        if (peek('{')) {
          ++pos_;
          size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos || close == pos_ || close - pos_ > 6) return error("bad \\u{...} escape");
          AFD_ASSIGN_OR_RETURN(v, hex_digits(close - pos_));
          ++pos_;
        } else {
          AFD_ASSIGN_OR_RETURN(v, hex_digits(4));
          // A surrogate pair written as two \u escapes is one code point.
          if (v >= 0xD800 && v <= 0xDBFF && starts_with("\\u")) {
            size_t save = pos_;
            pos_ += 2;
            auto lo = hex_digits(4);
            if (lo.ok() && *lo >= 0xDC00 && *lo <= 0xDFFF) {
              v = 0x10000 + ((v - 0xD800) << 10) + (*lo - 0xDC00);
            } else {
              pos_ = save;
            }
          }
        }
        if (v > CodePointSet::kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
          pos_ = start;
          return error("an escape of a lone surrogate or a value past U+10FFFF");
        }
        return one(v);
      }
      case 'c':
        if (pos_ < p_.size() && std::isalpha(static_cast<unsigned char>(p_[pos_]))) {
          return one(static_cast<char32_t>(p_[pos_++]) % 32);
        }
        pos_ = start;
        return error("bad \\c escape");
      case 'k': pos_ = start; return error("backreferences (\\k<name>) are not supported");
      case 'p':
      case 'P': pos_ = start; return error("Unicode property escapes (\\p{...}) are not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') {
      pos_ = start;
      return error("backreferences (\\" + std::string(1, c) + ") are not supported");
    }
    if (std::isalnum(static_cast<unsigned char>(c))) {
      pos_ = start;
      return error("unknown escape '\\" + std::string(1, c) + "'");
    }
    --pos_;
    return one(next_code_point());
  }

  Result<Node> parse_class() {
    size_t start = pos_;
    ++pos_;  // '['
    bool negated = peek('^');
    if (negated) ++pos_;
    CodePointSet set;
    bool first = true;
    while (true) {
      if (pos_ >= p_.size()) {
        pos_ = start;
        return error("unterminated character class");
      }
      if (peek(']')) break;
      // One class atom: a code point, or a set (\d ...), which cannot end a range.
      auto class_atom = [&]() -> Result<Node> {
        if (peek('\\')) return parse_escape(true);
        Node n;
        n.kind = Node::Kind::chars;
        n.chars = CodePointSet::of(next_code_point());
        return n;
      };
      AFD_ASSIGN_OR_RETURN(Node lo, class_atom());
      char32_t lo_cp = 0;
      bool lo_single = lo.chars.is_single(&lo_cp);
      if (peek('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        AFD_ASSIGN_OR_RETURN(Node hi, class_atom());
        char32_t hi_cp = 0;
        if (!lo_single || !hi.chars.is_single(&hi_cp)) return error("a class escape as a range endpoint");
        if (hi_cp < lo_cp) return error("a range out of order in a character class");
        set.add(lo_cp, hi_cp);
      } else {
        set.add(lo.chars);
      }
      first = false;
    }
    (void)first;
    ++pos_;  // ']'
    Node n;
    n.kind = Node::Kind::chars;
    n.chars = negated ? set.complement() : set;
    if (n.chars.empty()) {
      pos_ = start;
      return error("a character class that matches nothing");
    }
    return n;
  }

  std::string_view p_;
  size_t pos_ = 0;
};

class Emitter {
 public:
  Emitter(GbnfBuilder& b, bool json) : b_(b), json_(json) {}

  // GBNF for the node; "" when it matches only the empty text.
  std::string emit(const Node& n) {
    switch (n.kind) {
      case Node::Kind::chars: {
        char32_t cp = 0;
        if (n.chars.is_single(&cp)) return single(cp);
        return json_ ? n.chars.gbnf_json_char() : n.chars.gbnf_class();
      }
      case Node::Kind::seq: {
        std::string out;
        std::string text;  // a run of single code points, written as one literal
        auto flush = [&] {
          if (text.empty()) return;
          out += (out.empty() ? "" : " ") + GbnfBuilder::literal(text);
          text.clear();
        };
        for (const auto& item : n.items) {
          char32_t cp = 0;
          if (item.kind == Node::Kind::chars && item.chars.is_single(&cp)) {
            if (json_) {
              text += json_spelling(cp);
            } else {
              utf8_append(&text, cp);
            }
            continue;
          }
          flush();
          std::string part = emit(item);
          if (part.empty()) continue;
          out += (out.empty() ? "" : " ") + group_if_alt(part);
        }
        flush();
        return out;
      }
      case Node::Kind::alt: {
        std::vector<std::string> alts;
        bool has_empty = false;
        for (const auto& item : n.items) {
          std::string part = emit(item);
          if (part.empty()) {
            has_empty = true;
          } else {
            alts.push_back(part);
          }
        }
        if (alts.empty()) return "";
        std::string out = "(";
        for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
        return out + (has_empty ? ")?" : ")");
      }
      case Node::Kind::repeat: {
        std::string inner = emit(n.items[0]);
        if (inner.empty() || (n.max && *n.max == 0)) return "";
        return GbnfBuilder::repeat(atomic(inner), n.min, n.max);
      }
    }
    return "";
  }

 private:
  std::string single(char32_t cp) {
    std::string text;
    if (json_) {
      text = json_spelling(cp);
    } else {
      utf8_append(&text, cp);
    }
    return GbnfBuilder::literal(text);
  }
  // Whether `stop` holds for a character of GBNF expression text s outside its literals,
  // classes and parenthesised groups.
  template <class Stop>
  static bool any_top_level(const std::string& s, Stop stop) {
    int depth = 0;
    bool in_str = false, in_class = false;
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if (in_str || in_class) {
        if (c == '\\') {
          ++i;
        } else if ((in_str && c == '"') || (in_class && c == ']')) {
          in_str = in_class = false;
        }
        continue;
      }
      if (c == '"') {
        in_str = true;
      } else if (c == '[') {
        in_class = true;
      } else if (c == '(') {
        ++depth;
      } else if (c == ')') {
        --depth;
      } else if (depth == 0 && stop(c)) {
        return true;
      }
    }
    return false;
  }
  // One element: a name, a literal, a class, or a group, with nothing after it.
  static bool is_atomic(const std::string& s) {
    return !any_top_level(s, [](char c) { return c == ' ' || c == '|' || c == '?' || c == '*' || c == '+' || c == '{'; });
  }
  static std::string atomic(const std::string& s) { return is_atomic(s) ? s : "(" + s + ")"; }
  // Parts of a sequence: alternatives at the top level need parentheses.
  static std::string group_if_alt(const std::string& s) {
    return any_top_level(s, [](char c) { return c == '|'; }) ? "(" + s + ")" : s;
  }

  GbnfBuilder& b_;
  bool json_;
};

}  // namespace

Result<std::string> regex_gbnf(GbnfBuilder& b, std::string_view pattern, bool anchored_both_ends,
                               bool in_json_string) {
  if (pattern.size() > kMaxPatternBytes) {
    return invalid_argument("regex: longer than the " + std::to_string(kMaxPatternBytes) + " bytes supported");
  }
  if (size_t bad = utf8_invalid_offset(pattern); bad != std::string_view::npos) {
    return invalid_argument("regex: not valid UTF-8 at offset " + std::to_string(bad));
  }
  RegexParser parser(pattern);
  AFD_ASSIGN_OR_RETURN(auto branches, parser.parse());
  Emitter emitter(b, in_json_string);
  std::string any;  // any text, for the unanchored sides
  if (!anchored_both_ends) {
    any = in_json_string ? b.json_char() + "*" : CodePointSet::all().gbnf_class() + "*";
  }
  std::vector<std::string> alts;
  bool has_empty = false;
  for (const auto& br : branches) {
    std::string body = emitter.emit(br.node);
    if (!body.empty() && body.find('|') != std::string::npos) body = "(" + body + ")";
    std::string alt;
    auto add = [&](const std::string& part) {
      if (!part.empty()) alt += (alt.empty() ? "" : " ") + part;
    };
    if (!br.start_anchored) add(any);
    add(body);
    if (!br.end_anchored) add(any);
    if (alt.empty()) {
      has_empty = true;
    } else {
      alts.push_back(alt);
    }
  }
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  if (has_empty) out = alts.empty() ? "\"\"" : "(" + out + ")?";
  return out;
}

Result<std::string> GbnfBuilder::add_regex(std::string_view pattern, bool anchored_both_ends,
                                           std::string_view name_hint, bool in_json_string) {
  AFD_ASSIGN_OR_RETURN(std::string body, regex_gbnf(*this, pattern, anchored_both_ends, in_json_string));
  std::string name = add_rule(name_hint, std::move(body));
  if (over_limits()) return invalid_argument("regex: needs more grammar than the limits allow");
  return name;
}

}  // namespace afd::serve
