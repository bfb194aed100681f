#include "serve/text/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace afd::serve {
namespace {

struct ByteTables {
  std::array<char32_t, 256> to_cp{};
  std::array<std::array<char, 2>, 256> to_utf8{};  // to_cp as UTF-8 (all are 1 or 2 bytes)
  std::array<uint8_t, 256> utf8_len{};
  std::array<int, 324> from_cp{};          // code points 0..323 -> byte or -1
  ByteTables() {
    from_cp.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      from_cp[to_cp[b]] = b;
      std::string u;
      utf8_append(&u, to_cp[b]);
      utf8_len[b] = static_cast<uint8_t>(u.size());
      std::copy(u.begin(), u.end(), to_utf8[b].begin());
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

int utf8_sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF5) return 4;
  return 0;
}

char32_t utf8_decode(std::string_view s, size_t pos, size_t* len) {
  auto b0 = static_cast<unsigned char>(s[pos]);
  int n = utf8_sequence_length(b0);
  *len = 1;
  if (n == 1) return b0;
  if (n == 0 || pos + n > s.size()) return 0xFFFD;
  char32_t cp = b0 & (0xFF >> (n + 1));
  for (int i = 1; i < n; ++i) {
    auto b = static_cast<unsigned char>(s[pos + i]);
    if ((b & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong encodings, surrogates and > U+10FFFF are invalid.
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0xFFFD;
  *len = n;
  return cp;
}

void utf8_append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_complete_prefix(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    int len = utf8_sequence_length(b);
    if (len > static_cast<int>(back)) {
      // Incomplete only if the bytes present so far are valid continuations.
      return n - back;
    }
    return n;
  }
  return n;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    char32_t cp = utf8_decode(s, i, &len);
    if (cp == 0xFFFD && len == 1 && static_cast<unsigned char>(s[i]) >= 0x80) {
      utf8_append(&out, 0xFFFD);
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  return out;
}

size_t utf8_invalid_offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (i + 8 <= s.size()) {  // skip ASCII eight bytes at a time
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if ((w & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    char32_t cp = utf8_decode(s, i, &len);
    if (cp == 0xFFFD && len == 1) return i;
    i += len;
  }
  return std::string_view::npos;
}

bool is_letter(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool is_number(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool is_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

char32_t byte_to_unicode(uint8_t b) { return byte_tables().to_cp[b]; }

int unicode_to_byte(char32_t cp) {
  return cp < 324 ? byte_tables().from_cp[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  const ByteTables& t = byte_tables();
  for (char c : bytes) {
    auto b = static_cast<uint8_t>(c);
    out.append(t.to_utf8[b].data(), t.utf8_len[b]);
  }
  return out;
}

std::string byte_level_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    size_t len;
    char32_t cp = utf8_decode(text, i, &len);
    int b = unicode_to_byte(cp);
    if (b >= 0) out.push_back(static_cast<char>(b));
    else out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace afd::serve
