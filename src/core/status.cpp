#include "core/status.h"

namespace afd {

const char* status_code_name(StatusCode c) {
  switch (c) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::not_found: return "not_found";
    case StatusCode::io_error: return "io_error";
    case StatusCode::corrupt_data: return "corrupt_data";
    case StatusCode::out_of_range: return "out_of_range";
    case StatusCode::resource_exhausted: return "resource_exhausted";
    case StatusCode::unavailable: return "unavailable";
    case StatusCode::timeout: return "timeout";
    case StatusCode::cancelled: return "cancelled";
    case StatusCode::not_supported: return "not_supported";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

const std::string& Status::empty_message() {
  static const std::string empty;
  return empty;
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message();
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(code_, context + ": " + message());
}

}  // namespace afd
