#include "serve/pre_tokenizer.h"

#include "serve/unicode.h"

namespace afd::serve {
namespace {

const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* kQwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
const char* kLlama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// Code points of the text with their byte offsets; one extra sentinel entry at the end.
struct Cps {
  std::vector<char32_t> cp;
  std::vector<size_t> off;
};

Cps decode_all(std::string_view s) {
  Cps c;
  c.cp.reserve(s.size() + 1);
  c.off.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    c.cp.push_back(utf8_decode(s, i, &len));
    c.off.push_back(i);
    i += len;
  }
  c.off.push_back(s.size());
  return c;
}

bool is_nl(char32_t c) { return c == '\r' || c == '\n'; }
bool is_other(char32_t c) { return !is_whitespace(c) && !is_letter(c) && !is_number(c); }  // [^\s\p{L}\p{N}]

// Contraction at i: returns code points matched (0 if none).
size_t match_contraction(const std::vector<char32_t>& cp, size_t i, bool icase) {
  if (cp[i] != '\'' || i + 1 >= cp.size()) return 0;
  auto lc = [&](size_t k) -> char32_t {
    if (k >= cp.size()) return 0;
    char32_t c = cp[k];
    return (icase && c >= 'A' && c <= 'Z') ? c + 32 : c;
  };
  char32_t a = lc(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  char32_t b = lc(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// \s+(?!\S) then \s+ for a whitespace run starting at i (cp[i] is whitespace).
size_t match_space_run(const std::vector<char32_t>& cp, size_t i) {
  size_t n = cp.size(), j = i;
  while (j < n && is_whitespace(cp[j])) ++j;
  if (j == n) return j - i;           // \s+(?!\S) at end of text
  if (j - 1 > i) return j - 1 - i;    // leave the last space to prefix the next word
  return j - i;                       // \s+
}

size_t match_gpt2(const std::vector<char32_t>& cp, size_t i) {
  size_t n = cp.size();
  if (size_t m = match_contraction(cp, i, false)) return m;
  size_t k = (cp[i] == ' ' && i + 1 < n) ? i + 1 : i;  // optional leading space
  for (int cls = 0; cls < 3; ++cls) {
    auto in = [&](char32_t c) { return cls == 0 ? is_letter(c) : cls == 1 ? is_number(c) : is_other(c); };
    if (in(cp[k])) {
      size_t j = k;
      while (j < n && in(cp[j])) ++j;
      return j - i;
    }
  }
  if (is_whitespace(cp[i])) return match_space_run(cp, i);
  return 1;
}

size_t match_qwen2(const std::vector<char32_t>& cp, size_t i, size_t max_digits) {
  size_t n = cp.size();
  if (size_t m = match_contraction(cp, i, true)) return m;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t k = i;
    if (!is_nl(cp[i]) && !is_letter(cp[i]) && !is_number(cp[i]) && i + 1 < n && is_letter(cp[i + 1])) k = i + 1;
    if (is_letter(cp[k])) {
      size_t j = k;
      while (j < n && is_letter(cp[j])) ++j;
      return j - i;
    }
  }
  // \p{N}{1,max_digits}
  if (is_number(cp[i])) {
    size_t j = i;
    while (j < n && j - i < max_digits && is_number(cp[j])) ++j;
    return j - i;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  {
    size_t k = (cp[i] == ' ' && i + 1 < n && is_other(cp[i + 1])) ? i + 1 : i;
    if (is_other(cp[k])) {
      size_t j = k;
      while (j < n && is_other(cp[j])) ++j;
      while (j < n && is_nl(cp[j])) ++j;
      return j - i;
    }
  }
  if (is_whitespace(cp[i])) {
    // \s*[\r\n]+ : the whitespace run up to and including its last newline.
    size_t j = i;
    size_t last_nl = SIZE_MAX;
    while (j < n && is_whitespace(cp[j])) {
      if (is_nl(cp[j])) last_nl = j;
      ++j;
    }
    if (last_nl != SIZE_MAX) return last_nl + 1 - i;
    return match_space_run(cp, i);
  }
  return 1;
}

}  // namespace

Result<SplitPattern> split_pattern_from_regex(const std::string& regex) {
  if (regex == kGpt2) return SplitPattern::gpt2;
  if (regex == kQwen2) return SplitPattern::qwen2;
  if (regex == kLlama3) return SplitPattern::llama3;
  return not_supported("pre-tokenizer regex is not one of the supported patterns (GPT-2, Qwen2, Llama 3): " +
                       regex.substr(0, 200));
}

const char* split_pattern_regex(SplitPattern p) {
  switch (p) {
    case SplitPattern::gpt2: return kGpt2;
    case SplitPattern::qwen2: return kQwen2;
    case SplitPattern::llama3: return kLlama3;
  }
  return kQwen2;
}

std::vector<std::string_view> pre_tokenize(std::string_view text, SplitPattern p) {
  std::vector<std::string_view> out;
  Cps c = decode_all(text);
  size_t n = c.cp.size(), i = 0;
  while (i < n) {
    size_t m = p == SplitPattern::gpt2     ? match_gpt2(c.cp, i)
               : p == SplitPattern::qwen2 ? match_qwen2(c.cp, i, 1)
                                          : match_qwen2(c.cp, i, 3);
    if (m == 0) m = 1;
    out.push_back(text.substr(c.off[i], c.off[i + m] - c.off[i]));
    i += m;
  }
  return out;
}

}  // namespace afd::serve
