// Whole-file reads for the plan module's input files (JSON, CSV).
#pragma once

#include <string>

#include "core/status.h"

namespace afd::plan {

// The bytes of the file at `path`; io_error "cannot open <what> '<path>'" when it cannot be opened.
Result<std::string> read_text_file(const std::string& path, const std::string& what);

}  // namespace afd::plan
