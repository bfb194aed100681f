// TestClient: a blocking HTTP client for tests over http::ClientExchange (serve/http/client.h),
// one connection per request. An answer is an HttpResult; a request that got no whole answer
// gives an empty optional and error() says why.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "serve/http/client.h"

namespace afd::serve::testing {

struct HttpResult : http::ResponseHead {
  std::string body;
};

class TestClient {
 public:
  TestClient(std::string host, int port, int timeout_ms = 30000)
      : host_(std::move(host)), port_(port), timeout_ms_(timeout_ms) {}

  std::optional<HttpResult> get(const std::string& path, const http::Headers& headers = {}) {
    return send("GET", path, headers, "");
  }
  // POSTs body as application/json.
  std::optional<HttpResult> post(const std::string& path, const std::string& body,
                                 const http::Headers& headers = {}) {
    http::Headers h = {{"Content-Type", "application/json"}};
    h.insert(h.end(), headers.begin(), headers.end());
    return send("POST", path, h, body);
  }
  // Why the last request got no answer ("" after one that did).
  const std::string& error() const { return error_; }

 private:
  std::optional<HttpResult> send(const std::string& method, const std::string& path, const http::Headers& headers,
                                 const std::string& body) {
    http::ClientExchange ex(host_, port_, http::ClientTimeouts{timeout_ms_, timeout_ms_, timeout_ms_});
    HttpResult r;
    const http::ClientOutcome o = ex.run(
        method, path, headers, body,
        [&r](const http::ResponseHead& h) {
          static_cast<http::ResponseHead&>(r) = h;
          return true;
        },
        [&r](const char* d, size_t n) {
          r.body.append(d, n);
          return true;
        });
    if (o.end != http::ClientEnd::completed) {
      error_ = "no whole answer (ClientEnd " + std::to_string(static_cast<int>(o.end)) + "): " + o.detail;
      return std::nullopt;
    }
    error_.clear();
    return r;
  }

  std::string host_;
  int port_;
  int timeout_ms_;
  std::string error_;
};

}  // namespace afd::serve::testing
