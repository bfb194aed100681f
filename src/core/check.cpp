#include "core/check.h"

namespace afd {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::string what = std::string(file) + ":" + std::to_string(line) + ": check failed: " + cond;
  if (!msg.empty()) what += " (" + msg + ")";
  throw InternalError(what);
}

}  // namespace afd
