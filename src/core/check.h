// AFD_CHECK: internal invariants only. Never guard request or file data with it:
// those travel as Status (status.h). A failed check throws afd::InternalError with
// file and line, so a long-running server can log it and fail one request.
#pragma once

#include <stdexcept>
#include <string>

namespace afd {

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace afd

#define AFD_CHECK(cond, ...)                                                          \
  do {                                                                                \
    if (__builtin_expect(!(cond), 0)) ::afd::check_failed(__FILE__, __LINE__, #cond, \
                                                          std::string(__VA_ARGS__));  \
  } while (0)
