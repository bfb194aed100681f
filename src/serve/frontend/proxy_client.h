// UpstreamCall: one HTTP exchange from the front end with an attention worker (an
// http::ClientExchange, serve/http/client.h), delivering the response status/headers and
// then the body bytes as they arrive, so SSE chunks can be read without buffering. Failures
// are unavailable Statuses that say what happened in words. cancel() from any thread closes
// the connection (the worker sees its next write fail and cancels the sequence). Every wait is
// bounded: connecting by connect_ms, sending by write_s, and each wait for the next byte by
// read_s (the proxy session also watches for silence itself, serve/frontend/proxy_session.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/metrics/metrics_federation.h"

namespace afd::serve {

namespace http {
class ClientExchange;
}

struct UpstreamTimeouts {
  int connect_ms = 2000;
  int read_s = 600;   // longest wait for the next response byte
  int write_s = 30;   // longest wait to send the next piece of the request
};

struct UpstreamHead {
  int status = 0;
  std::string content_type;
  std::string retry_after;  // empty if absent
};

struct UpstreamOutcome {
  bool responded = false;  // a status line arrived: the worker took the request
  bool completed = false;  // the whole body arrived
  bool cancelled = false;  // a callback or cancel() ended the exchange
  Status error;            // why it did not complete (when !completed && !cancelled)
};

class UpstreamCall {
 public:
  UpstreamCall(const std::string& host, int port, UpstreamTimeouts t);
  ~UpstreamCall();
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;

  // POSTs body (application/json, with `headers` added) to path. on_head runs once when the
  // status line and headers arrive, on_data for each piece of the body; either returning
  // false abandons the exchange (closing the connection). Blocks until done; call once.
  UpstreamOutcome post(const std::string& path, const std::string& body,
                       const std::function<bool(const UpstreamHead&)>& on_head,
                       const std::function<bool(const char*, size_t)>& on_data,
                       const std::vector<std::pair<std::string, std::string>>& headers = {});
  // Thread-safe; idempotent. Ends a post() in progress (or makes a later one end at once).
  void cancel();

 private:
  std::string where_;
  UpstreamTimeouts timeouts_;
  std::unique_ptr<http::ClientExchange> exchange_;
};

struct HttpAnswer {
  int status = 0;
  std::string body;
};
// GET host:port/path within timeout_ms: the status and body, whatever the status.
// unavailable when there is no answer (connection refused, timeout), resource_exhausted
// past max_bytes of body (the rest is not read).
Result<HttpAnswer> http_get(const std::string& host, int port, const std::string& path, int timeout_ms,
                            size_t max_bytes);
// POST body (application/json, with `headers` added) to host:port/path within timeout_ms: the
// status and body, whatever the status; errors as http_get's.
Result<HttpAnswer> http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                             const std::vector<std::pair<std::string, std::string>>& headers, int timeout_ms,
                             size_t max_bytes);
// The same as http_get, but only a 200 answer is one (another status is unavailable); its body.
Result<std::string> http_get_body(const std::string& host, int port, const std::string& path, int timeout_ms,
                                  size_t max_bytes);
// Federation's scrape over HTTP (MetricsScrape): http_get_body of t's /metrics, at most
// kMaxScrapeBytes.
Result<std::string> http_scrape_metrics(const MetricsTarget& t, int timeout_ms);

}  // namespace afd::serve
