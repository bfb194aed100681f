// Whole-file reads and JSON parsing for the plan module's input files (JSON, CSV).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace afd::plan {

// The bytes of the file at `path`; io_error "cannot open <what> '<path>'" when it cannot be opened.
Result<std::string> read_text_file(const std::string& path, const std::string& what);

// `text` parsed as JSON; corrupt_data "<source>: invalid JSON: ..." when it is not JSON.
Result<nlohmann::json> parse_json(const std::string& text, const std::string& source);

}  // namespace afd::plan
