#include "serve/frontend/proxy_client.h"

#include "serve/http/client.h"

namespace afd::serve {
namespace {

// What a failed exchange means, in words.
std::string describe(const http::ClientOutcome& o, int read_timeout_ms, int connect_timeout_ms) {
  switch (o.end) {
    case http::ClientEnd::unreachable: return "connection refused (nothing listening) or host unreachable";
    case http::ClientEnd::connect_timeout:
      return "connect timed out after " + std::to_string(connect_timeout_ms) + " ms";
    case http::ClientEnd::read_timeout:
      return "no answer within " + std::to_string(read_timeout_ms) + " ms (read timed out)";
    case http::ClientEnd::closed: return "connection closed or reset by the peer";
    case http::ClientEnd::write_failed:
      return "sending the request failed (connection closed or reset, or write timed out)";
    case http::ClientEnd::malformed: return "not a valid HTTP answer (" + o.detail + ")";
    case http::ClientEnd::cancelled: return "cancelled";
    case http::ClientEnd::completed: break;
  }
  return "completed";
}

// One exchange of http_get / http_post, every wait bounded by timeout_ms.
Result<HttpAnswer> exchange(const std::string& method, const std::string& host, int port, const std::string& path,
                            const http::Headers& headers, const std::string& body, int timeout_ms, size_t max_bytes) {
  http::ClientExchange ex(host, port, http::ClientTimeouts{timeout_ms, timeout_ms, timeout_ms});
  const std::string where = host + ":" + std::to_string(port) + path;
  HttpAnswer a;
  bool too_long = false;
  const http::ClientOutcome o = ex.run(
      method, path, headers, body,
      [&](const http::ResponseHead& h) {
        a.status = h.status;
        return true;
      },
      [&](const char* data, size_t n) {
        if (a.body.size() + n > max_bytes) {
          too_long = true;
          return false;
        }
        a.body.append(data, n);
        return true;
      });
  if (too_long) return resource_exhausted(where + ": answer longer than " + std::to_string(max_bytes) + " bytes");
  if (o.end != http::ClientEnd::completed) return unavailable(where + ": " + describe(o, timeout_ms, timeout_ms));
  return a;
}

}  // namespace

UpstreamCall::UpstreamCall(const std::string& host, int port, UpstreamTimeouts t)
    : where_(host + ":" + std::to_string(port)),
      timeouts_(t),
      exchange_(std::make_unique<http::ClientExchange>(
          host, port, http::ClientTimeouts{t.connect_ms, t.write_s * 1000, t.read_s * 1000})) {}

UpstreamCall::~UpstreamCall() = default;

void UpstreamCall::cancel() { exchange_->cancel(); }

UpstreamOutcome UpstreamCall::post(const std::string& path, const std::string& body,
                                   const std::function<bool(const UpstreamHead&)>& on_head,
                                   const std::function<bool(const char*, size_t)>& on_data,
                                   const std::vector<std::pair<std::string, std::string>>& headers) {
  http::Headers h = {{"Content-Type", "application/json"}, {"Accept", "application/json, text/event-stream"}};
  h.insert(h.end(), headers.begin(), headers.end());
  const http::ClientOutcome o = exchange_->run(
      "POST", path, h, body,
      [&](const http::ResponseHead& r) {
        return on_head(UpstreamHead{r.status, r.get_header_value("Content-Type"), r.get_header_value("Retry-After")});
      },
      on_data);
  UpstreamOutcome out;
  out.responded = o.responded;
  if (o.end == http::ClientEnd::completed) {
    out.completed = true;
  } else if (o.end == http::ClientEnd::cancelled) {
    out.cancelled = true;
  } else {
    out.error = unavailable("attention worker " + where_ + ": " +
                            describe(o, timeouts_.read_s * 1000, timeouts_.connect_ms) +
                            (out.responded ? " (mid-response)" : ""));
  }
  return out;
}

Result<HttpAnswer> http_get(const std::string& host, int port, const std::string& path, int timeout_ms,
                            size_t max_bytes) {
  return exchange("GET", host, port, path, {}, "", timeout_ms, max_bytes);
}

Result<HttpAnswer> http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                             const std::vector<std::pair<std::string, std::string>>& headers, int timeout_ms,
                             size_t max_bytes) {
  http::Headers h = {{"Content-Type", "application/json"}};
  h.insert(h.end(), headers.begin(), headers.end());
  return exchange("POST", host, port, path, h, body, timeout_ms, max_bytes);
}

Result<std::string> http_get_body(const std::string& host, int port, const std::string& path, int timeout_ms,
                                  size_t max_bytes) {
  AFD_ASSIGN_OR_RETURN(HttpAnswer a, http_get(host, port, path, timeout_ms, max_bytes));
  if (a.status != 200)
    return unavailable(host + ":" + std::to_string(port) + path + ": answered " + std::to_string(a.status));
  return std::move(a.body);
}

Result<std::string> http_scrape_metrics(const MetricsTarget& t, int timeout_ms) {
  return http_get_body(t.host, t.port, "/metrics", timeout_ms, kMaxScrapeBytes);
}

}  // namespace afd::serve
