// Python's str operations that Jinja templates observe (internal to the interpreter), over
// UTF-8: Python strings index, strip, split and change case by code point, not by byte.
// Pure functions of their arguments; the callers charge the render's budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace afd::serve::jinja {

// Python's str.isspace for one code point.
bool py_isspace(char32_t cp);
// Number of code points of s.
size_t utf8_length(std::string_view s);
// Byte offset of code point `index` (0 <= index <= length).
size_t utf8_offset(std::string_view s, size_t index);
// Code points of s as byte ranges.
std::vector<std::string_view> code_points(const std::string& s);

// Case of one code point: glibc's simple mappings from the built-in C.UTF-8 locale (Python
// uses the full mappings, which differ for a few characters such as ß -> SS), ASCII only
// where that locale is missing.
bool cp_is_upper(char32_t c);
bool cp_is_lower(char32_t c);
bool cp_is_cased(char32_t c);

// str.upper/lower/capitalize/title, and jinja2's title filter (title_jinja: words start
// after whitespace, '-', '(', '{', '[' or '<').
enum class CaseMode { upper, lower, capitalize, title_py, title_jinja };
std::string map_case(const std::string& s, CaseMode mode);

// Python's str.strip family: chars == nullptr strips whitespace, else any code point of *chars.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
// Python's str.splitlines() boundaries: \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029.
std::vector<std::string> py_splitlines(const std::string& s);
// Number of line boundaries py_splitlines finds (at most s.size()).
size_t count_lines(const std::string& s);

// Python's int(str): optional whitespace and sign, digits with single underscores between;
// false when Python would raise or the value does not fit int64.
bool parse_py_int(const std::string& text, int64_t* out);
// Python's float(str): whitespace, sign, decimal or exponent forms, inf/nan, underscores.
bool parse_py_float(const std::string& text, double* out);

}  // namespace afd::serve::jinja
