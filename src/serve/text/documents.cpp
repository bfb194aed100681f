#include "serve/text/documents.h"

#include "serve/text/unicode.h"

namespace afd::serve {

Status check_text_file(std::string_view text, const std::string& source) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    return invalid_argument(source + ": binary or not UTF-8 (a NUL byte at byte offset " + std::to_string(nul) + ")");
  if (const size_t bad = utf8_invalid_offset(text); bad != std::string_view::npos)
    return invalid_argument(source + ": binary or not UTF-8 (invalid UTF-8 at byte offset " + std::to_string(bad) +
                            ")");
  return Status();
}

std::vector<std::string_view> split_documents(std::string_view text, std::string_view separator) {
  auto trimmed = [](std::string_view s) {
    constexpr std::string_view kSpace = " \t\r\n";
    const size_t b = s.find_first_not_of(kSpace);
    if (b == std::string_view::npos) return std::string_view();
    return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
  };
  std::vector<std::string_view> out;
  auto add = [&](std::string_view piece) {
    if (std::string_view t = trimmed(piece); !t.empty()) out.push_back(t);
  };
  if (separator.empty()) {
    add(text);
    return out;
  }
  size_t at = 0;
  for (size_t hit; (hit = text.find(separator, at)) != std::string_view::npos; at = hit + separator.size())
    add(text.substr(at, hit - at));
  add(text.substr(at));
  return out;
}

}  // namespace afd::serve
