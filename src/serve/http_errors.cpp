#include "serve/http_errors.h"

#include <exception>

#include <httplib.h>

#include "core/log.h"
#include "serve/response.h"

namespace afd::serve {

void send_error(httplib::Response& res, int status, const std::string& msg, int retry_after_s) {
  res.status = status;
  if (status == 429 || status == 503) res.set_header("Retry-After", std::to_string(retry_after_s));
  res.set_content(error_body(status, msg), "application/json");
}

void install_error_handlers(httplib::Server& s, size_t max_body_bytes, const std::string& who) {
  s.set_error_handler([max_body_bytes](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = res.status == 404   ? "no route for " + req.method + " " + req.path
                      : res.status == 413 ? "request body larger than " + std::to_string(max_body_bytes) + " bytes"
                                          : "HTTP error " + std::to_string(res.status);
    res.set_content(error_body(res.status, msg), "application/json");
  });
  s.set_exception_handler([who](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    spdlog::error("{}: {}", who, what);
    res.status = 500;
    res.set_content(error_body(500, what), "application/json");
  });
}

}  // namespace afd::serve
