#include "serve/structured/code_point_set.h"

#include <algorithm>
#include <cstdio>

#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

constexpr char32_t kSurrogateLo = 0xD800;
constexpr char32_t kSurrogateHi = 0xDFFF;

std::string hex(char32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%0*x", digits, static_cast<unsigned>(v));
  return buf;
}

}  // namespace

std::string gbnf_escape_code_point(char32_t cp, std::string_view specials) {
  if (cp >= 0x20 && cp < 0x7F && specials.find(static_cast<char>(cp)) == std::string_view::npos) {
    return std::string(1, static_cast<char>(cp));
  }
  if (cp < 0x100) return "\\x" + hex(cp, 2);
  if (cp < 0x10000) return "\\u" + hex(cp, 4);
  return "\\U" + hex(cp, 8);
}

std::string json_spelling(char32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  if (cp < 0x20) return "\\u00" + hex(cp, 2);
  std::string out;
  utf8_append(&out, cp);
  return out;
}

CodePointSet CodePointSet::range(char32_t lo, char32_t hi) {
  CodePointSet s;
  s.add(lo, hi);
  return s;
}

void CodePointSet::add(char32_t lo, char32_t hi) {
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi) return;
  if (lo <= kSurrogateHi && hi >= kSurrogateLo) {  // split around the surrogates
    if (lo < kSurrogateLo) add(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) add(kSurrogateHi + 1, hi);
    return;
  }
  std::vector<std::pair<char32_t, char32_t>> out;
  out.reserve(ranges_.size() + 1);
  bool placed = false;
  for (const auto& r : ranges_) {
    if (r.second + 1 < lo) {
      out.push_back(r);
    } else if (hi + 1 < r.first) {
      if (!placed) out.emplace_back(lo, hi), placed = true;
      out.push_back(r);
    } else {  // overlapping or adjacent: merge into [lo, hi]
      lo = std::min(lo, r.first);
      hi = std::max(hi, r.second);
    }
  }
  if (!placed) out.emplace_back(lo, hi);
  ranges_ = std::move(out);
}

void CodePointSet::add(const CodePointSet& other) {
  for (const auto& r : other.ranges_) add(r.first, r.second);
}

CodePointSet CodePointSet::complement() const {
  CodePointSet out;
  char32_t next = 0;
  for (const auto& r : ranges_) {
    if (r.first > next) out.add(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.add(next, kMaxCodePoint);
  return out;
}

CodePointSet CodePointSet::minus(const CodePointSet& other) const {
  CodePointSet keep = other.complement();
  CodePointSet out;
  // Intersection of two sorted interval lists.
  size_t i = 0, j = 0;
  while (i < ranges_.size() && j < keep.ranges_.size()) {
    char32_t lo = std::max(ranges_[i].first, keep.ranges_[j].first);
    char32_t hi = std::min(ranges_[i].second, keep.ranges_[j].second);
    if (lo <= hi) out.ranges_.emplace_back(lo, hi);
    if (ranges_[i].second < keep.ranges_[j].second) ++i; else ++j;
  }
  return out;
}

bool CodePointSet::contains(char32_t cp) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), cp,
                             [](char32_t v, const std::pair<char32_t, char32_t>& r) { return v < r.first; });
  return it != ranges_.begin() && std::prev(it)->second >= cp;
}

bool CodePointSet::is_single(char32_t* cp) const {
  if (ranges_.size() != 1 || ranges_[0].first != ranges_[0].second) return false;
  *cp = ranges_[0].first;
  return true;
}

std::string CodePointSet::gbnf_class() const {
  static constexpr std::string_view kSpecials = "]\\^-[\"";
  std::string out = "[";
  for (const auto& r : ranges_) {
    out += gbnf_escape_code_point(r.first, kSpecials);
    if (r.second != r.first) {
      if (r.second != r.first + 1) out += '-';
      out += gbnf_escape_code_point(r.second, kSpecials);
    }
  }
  return out + "]";
}

std::string CodePointSet::gbnf_json_char() const {
  CodePointSet escaped = range(0, 0x1F);
  escaped.add('"', '"');
  escaped.add('\\', '\\');
  std::vector<std::string> alts;
  CodePointSet raw = minus(escaped);
  if (!raw.empty()) alts.push_back(raw.gbnf_class());
  // Members that JSON escapes: the short escapes as one class after '\', the rest as \u00XX.
  std::string short_letters;
  CodePointSet long_form;
  for (char32_t cp = 0; cp <= 0x5C; ++cp) {
    if (!escaped.contains(cp) || !contains(cp)) continue;
    std::string spelling = json_spelling(cp);
    if (spelling.size() == 2) {
      short_letters += spelling[1];
    } else {
      long_form.add(cp, cp);
    }
  }
  if (!short_letters.empty()) {
    std::string cls = "[";
    for (char c : short_letters) cls += gbnf_escape_code_point(static_cast<unsigned char>(c), "]\\^-[\"");
    alts.push_back("\"\\\\\" " + cls + "]");
  }
  // \u0000..\u000f and \u0010..\u001f: the last hex digit as a class over the members.
  for (char32_t high = 0; high < 2; ++high) {
    CodePointSet digits;
    for (char32_t low = 0; low < 16; ++low) {
      char32_t cp = high * 16 + low;
      if (long_form.contains(cp)) {
        char d = hex(low, 1)[0];
        digits.add(static_cast<unsigned char>(d), static_cast<unsigned char>(d));
      }
    }
    if (!digits.empty()) alts.push_back("\"\\\\u00" + std::to_string(high) + "\" " + digits.gbnf_class());
  }
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

}  // namespace afd::serve
