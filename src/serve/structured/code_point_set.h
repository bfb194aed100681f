// CodePointSet: a set of Unicode scalar values as sorted disjoint intervals, and its GBNF forms —
// a character class for raw text, and the alternatives that spell each member inside a JSON
// string (members that JSON requires escaped, '"', '\' and U+0000..U+001F, written with their
// one canonical escape). Surrogates (U+D800..U+DFFF) are never members. Pure values.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace afd::serve {

class CodePointSet {
 public:
  static constexpr char32_t kMaxCodePoint = 0x10FFFF;

  CodePointSet() = default;
  static CodePointSet of(char32_t cp) { return range(cp, cp); }
  // [lo, hi]; surrogates are dropped.
  static CodePointSet range(char32_t lo, char32_t hi);
  static CodePointSet all() { return range(0, kMaxCodePoint); }

  void add(char32_t lo, char32_t hi);
  void add(const CodePointSet& other);
  CodePointSet complement() const;
  CodePointSet minus(const CodePointSet& other) const;
  bool contains(char32_t cp) const;
  bool empty() const { return ranges_.empty(); }
  // A single member: that code point; otherwise none.
  bool is_single(char32_t* cp) const;
  const std::vector<std::pair<char32_t, char32_t>>& ranges() const { return ranges_; }

  // GBNF character class matching one member, e.g. `[a-z_]`. Precondition: !empty().
  std::string gbnf_class() const;
  // GBNF expression matching the JSON string spelling of one member: the members that may
  // appear raw as one class, the others as their canonical escapes (`\"`, `\\`, `\n`, `\u001f`).
  // Precondition: !empty().
  std::string gbnf_json_char() const;

 private:
  std::vector<std::pair<char32_t, char32_t>> ranges_;  // sorted, disjoint, non-adjacent
};

// One code point as a GBNF character-class or literal element: printable ASCII other than
// `specials` as itself, the rest as \xHH / \uHHHH / \UHHHHHHHH.
std::string gbnf_escape_code_point(char32_t cp, std::string_view specials);

// The canonical JSON spelling of one code point inside a string: raw UTF-8 unless it is '"',
// '\' or a control character below U+0020, which are escaped (`\"`, `\\`, `\b\f\n\r\t`, else
// `\u00XX`).
std::string json_spelling(char32_t cp);

}  // namespace afd::serve
