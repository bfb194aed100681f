#include "serve/api/http_common.h"

#include <algorithm>
#include <csignal>
#include <exception>

#include "core/log.h"
#include "serve/api/response.h"
#include "serve/http/server.h"

namespace afd::serve {

void send_error(http::Response& res, int status, const std::string& msg, int retry_after_s) {
  res.status = status;
  if (status == 429 || status == 503) res.set_header("Retry-After", std::to_string(retry_after_s));
  res.set_content(error_body(status, msg), "application/json");
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Runs over the longer length whatever the contents; only the length can leak.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

http::Options http_options(const ServerOptions& o, const std::string& who) {
  http::Options h;
  h.host = o.host;
  h.port = o.port;
  h.limits = o.limits;
  h.handler_threads = std::max(1, o.http_threads);
  h.name = who;
  h.error_body = [](int status, const std::string& msg) { return error_body(status, msg); };
  return h;
}

void configure_server(http::Server& s, const ServerOptions& o, const std::string& who,
                      std::function<void()> on_unauthorized) {
  s.set_pre_routing([key = o.api_key, retry = o.retry_after_s, on_unauthorized](const http::Request& req,
                                                                                 http::Response& res) {
    if (key.empty() || (req.path.rfind("/v1/", 0) != 0 && req.path.rfind("/admin/", 0) != 0)) return false;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) == 0 && constant_time_equal(auth.substr(prefix.size()), key)) return false;
    send_error(res, 401, "invalid or missing API key (Authorization: Bearer <key>)", retry);
    if (on_unauthorized && req.path.rfind("/v1/", 0) == 0) on_unauthorized();
    return true;
  });
  s.set_exception_handler([who](const http::Request&, http::Response& res, std::exception_ptr ep) {
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

Result<int> bind_server(http::Server& s, const ServerOptions&) {
  std::signal(SIGPIPE, SIG_IGN);
  return s.bind();
}

}  // namespace afd::serve
