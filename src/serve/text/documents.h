// A plain-text corpus for evaluation (afd eval): the file's bytes checked to be text, then cut
// into documents at a separator.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace afd::serve {

// ok when `text` is text: no NUL byte and valid UTF-8. Otherwise invalid_argument
// "SOURCE: binary or not UTF-8 (a NUL byte at byte offset N)" or "(invalid UTF-8 at byte
// offset N)".
Status check_text_file(std::string_view text, const std::string& source);

// The documents of `text`: the pieces between occurrences of `separator` (empty: the whole
// text is one document), each without its leading and trailing ASCII whitespace (space, tab,
// CR, LF); pieces left empty are dropped. Views into `text`.
std::vector<std::string_view> split_documents(std::string_view text, std::string_view separator);

}  // namespace afd::serve
