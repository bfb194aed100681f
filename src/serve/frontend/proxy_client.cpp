#include "serve/frontend/proxy_client.h"

#include <httplib.h>

#include <chrono>

namespace afd::serve {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// What a failed exchange means, in words (httplib's names are terse: "Connection", "Read",
// and a read that timed out is the same error as a connection the peer closed or reset).
// idle_ms: how long the exchange had gone without a byte from the peer when it failed;
// read_timeout_ms: the limit for that. httplib does not expose the socket error, so a read
// failing well before its timeout is told apart from a timeout by the time it took.
std::string describe(httplib::Error e, double idle_ms, int read_timeout_ms, int connect_timeout_ms) {
  switch (e) {
    case httplib::Error::Connection: return "connection refused (nothing listening) or host unreachable";
    case httplib::Error::ConnectionTimeout:
      return "connect timed out after " + std::to_string(connect_timeout_ms) + " ms";
    case httplib::Error::Read:
      // A timed-out read returns at its deadline; a closed or reset connection at once.
      if (idle_ms >= 0.9 * read_timeout_ms)
        return "no answer within " + std::to_string(read_timeout_ms) + " ms (read timed out)";
      return "connection closed or reset by the peer";
    case httplib::Error::Write: return "sending the request failed (connection closed or reset, or write timed out)";
    case httplib::Error::Canceled: return "cancelled";
    default: return httplib::to_string(e);
  }
}

void set_timeouts(httplib::Client* cli, int timeout_ms) {
  cli->set_connection_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  cli->set_read_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  cli->set_write_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
}

}  // namespace

UpstreamCall::UpstreamCall(const std::string& host, int port, UpstreamTimeouts t)
    : where_(host + ":" + std::to_string(port)), timeouts_(t), cli_(std::make_unique<httplib::Client>(host, port)) {
  cli_->set_connection_timeout(t.connect_ms / 1000, (t.connect_ms % 1000) * 1000);
  cli_->set_read_timeout(t.read_s, 0);
  cli_->set_write_timeout(t.write_s, 0);
  cli_->set_keep_alive(false);
  cli_->set_tcp_nodelay(true);
}

UpstreamCall::~UpstreamCall() = default;

void UpstreamCall::cancel() {
  std::lock_guard<std::mutex> l(mu_);
  cancelled_ = true;
  cli_->stop();  // shuts the socket down if a request is in flight
}

UpstreamOutcome UpstreamCall::post(const std::string& path, const std::string& body,
                                   const std::function<bool(const UpstreamHead&)>& on_head,
                                   const std::function<bool(const char*, size_t)>& on_data,
                                   const std::vector<std::pair<std::string, std::string>>& headers) {
  UpstreamOutcome out;
  bool by_callback = false;
  Clock::time_point last_byte = Clock::now();  // or the start: for telling a timeout from a reset
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "application/json, text/event-stream");
  for (const auto& [k, v] : headers) req.headers.emplace(k, v);
  req.response_handler = [&](const httplib::Response& r) {
    out.responded = true;
    last_byte = Clock::now();
    UpstreamHead h;
    h.status = r.status;
    h.content_type = r.get_header_value("Content-Type");
    h.retry_after = r.get_header_value("Retry-After");
    if (on_head(h)) return true;
    by_callback = true;
    return false;
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    last_byte = Clock::now();
    if (on_data(d, n)) return true;
    by_callback = true;
    return false;
  };
  {
    std::lock_guard<std::mutex> l(mu_);
    if (cancelled_) {
      out.cancelled = true;
      return out;
    }
  }
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli_->send(req, res, err);
  bool cancelled = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    cancelled = cancelled_;
  }
  if (ok) {
    out.completed = true;
  } else if (by_callback || cancelled) {
    out.cancelled = true;
  } else {
    out.error = unavailable("attention worker " + where_ + ": " +
                            describe(err, ms_since(last_byte), timeouts_.read_s * 1000, timeouts_.connect_ms) +
                            (out.responded ? " (mid-response)" : ""));
  }
  return out;
}

namespace {

// One exchange of http_get / http_post: `send(on_data)` performs it on `cli`.
template <typename Send>
Result<HttpAnswer> exchange(const std::string& host, int port, const std::string& path, int timeout_ms,
                            size_t max_bytes, Send send) {
  httplib::Client cli(host, port);
  set_timeouts(&cli, timeout_ms);
  const std::string where = host + ":" + std::to_string(port) + path;
  HttpAnswer a;
  bool too_long = false;
  const Clock::time_point start = Clock::now();
  auto r = send(cli, [&](const char* data, size_t n) {
    if (a.body.size() + n > max_bytes) {
      too_long = true;
      return false;
    }
    a.body.append(data, n);
    return true;
  });
  if (too_long) return resource_exhausted(where + ": answer longer than " + std::to_string(max_bytes) + " bytes");
  if (!r) return unavailable(where + ": " + describe(r.error(), ms_since(start), timeout_ms, timeout_ms));
  a.status = r->status;
  return a;
}

}  // namespace

Result<HttpAnswer> http_get(const std::string& host, int port, const std::string& path, int timeout_ms,
                            size_t max_bytes) {
  return exchange(host, port, path, timeout_ms, max_bytes, [&](httplib::Client& cli, auto on_data) {
    return cli.Get(path, httplib::ContentReceiver(on_data));
  });
}

Result<HttpAnswer> http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                             const std::vector<std::pair<std::string, std::string>>& headers, int timeout_ms,
                             size_t max_bytes) {
  return exchange(host, port, path, timeout_ms, max_bytes, [&](httplib::Client& cli, auto on_data) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    for (const auto& [k, v] : headers) req.set_header(k, v);
    req.content_receiver = [on_data](const char* d, size_t n, uint64_t, uint64_t) { return on_data(d, n); };
    return cli.send(req);
  });
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
