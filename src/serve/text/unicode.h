// UTF-8 decoding/encoding and validation, Unicode White_Space, plus GPT-2's byte <->
// printable-character mapping used by byte-level BPE. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace afd::serve {

// Decodes one code point at s[pos]. Sets *len to the bytes consumed (>= 1). Invalid or
// truncated sequences decode as U+FFFD consuming one byte.
char32_t utf8_decode(std::string_view s, size_t pos, size_t* len);
void utf8_append(std::string* out, char32_t cp);
// Number of bytes a UTF-8 sequence starting with lead byte b has (1..4), or 0 when b is a
// continuation byte or invalid lead.
int utf8_sequence_length(unsigned char b);
// Length of the longest prefix of s that ends on a complete code point boundary, treating
// an incomplete sequence at the very end as not yet complete (streaming): bytes after the
// returned length may become valid once more bytes arrive.
size_t utf8_complete_prefix(std::string_view s);
// Replaces invalid sequences with U+FFFD; the result is valid UTF-8.
std::string utf8_sanitize(std::string_view s);
// Byte offset of the first invalid or truncated UTF-8 sequence in s, or npos when s is
// valid UTF-8 (overlong forms, surrogates and code points past U+10FFFF are invalid).
size_t utf8_invalid_offset(std::string_view s);

bool is_letter(char32_t cp);  // Unicode general category L* (utf8proc)
bool is_number(char32_t cp);  // Unicode general category N* (utf8proc)
bool is_whitespace(char32_t cp);  // Unicode White_Space (Oniguruma's and Rust's \s)

// GPT-2 bytes_to_unicode(): byte -> code point of a printable character.
char32_t byte_to_unicode(uint8_t b);
// Inverse; returns -1 for code points that are not images of a byte.
int unicode_to_byte(char32_t cp);
// Maps each byte of `bytes` through byte_to_unicode, as UTF-8.
std::string bytes_to_byte_level(std::string_view bytes);
// Inverse of bytes_to_byte_level; characters outside the mapping are copied unchanged.
std::string byte_level_to_bytes(std::string_view text);

}  // namespace afd::serve
