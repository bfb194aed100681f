#include "serve/proxy_client.h"

#include <httplib.h>

namespace afd::serve {
namespace {

// What a failed exchange means, in words (httplib's names are terse: "Connection", "Read").
std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect (refused or unreachable)";
    case httplib::Error::ConnectionTimeout: return "connect timed out";
    case httplib::Error::Read: return "connection closed, reset or silent past the read timeout";
    case httplib::Error::Write: return "sending the request failed";
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
    : cli_(std::make_unique<httplib::Client>(host, port)) {
  cli_->set_connection_timeout(t.connect_ms / 1000, (t.connect_ms % 1000) * 1000);
  cli_->set_read_timeout(t.read_ms / 1000, (t.read_ms % 1000) * 1000);
  cli_->set_write_timeout(t.write_ms / 1000, (t.write_ms % 1000) * 1000);
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
                                   const std::vector<std::pair<std::string, std::string>>& headers,
                                   const std::function<bool(const UpstreamHead&)>& on_head,
                                   const std::function<bool(const char*, size_t)>& on_data) {
  UpstreamOutcome out;
  bool by_callback = false;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "application/json, text/event-stream");
  for (const auto& [k, v] : headers) req.headers.emplace(k, v);
  req.response_handler = [&](const httplib::Response& r) {
    out.responded = true;
    UpstreamHead h;
    h.status = r.status;
    h.content_type = r.get_header_value("Content-Type");
    h.retry_after = r.get_header_value("Retry-After");
    if (on_head(h)) return true;
    by_callback = true;
    return false;
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
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
    out.error = unavailable(describe(err) + (out.responded ? " (mid-response)" : ""));
  }
  return out;
}

Result<HttpAnswer> http_get(const std::string& host, int port, const std::string& path, int timeout_ms,
                            size_t max_bytes) {
  httplib::Client cli(host, port);
  set_timeouts(&cli, timeout_ms);
  const std::string where = host + ":" + std::to_string(port) + path;
  HttpAnswer a;
  bool too_long = false;
  auto r = cli.Get(path, [&](const char* data, size_t n) {
    if (a.body.size() + n > max_bytes) {
      too_long = true;
      return false;
    }
    a.body.append(data, n);
    return true;
  });
  if (too_long) return resource_exhausted(where + ": answer longer than " + std::to_string(max_bytes) + " bytes");
  if (!r) return unavailable(where + ": " + describe(r.error()));
  a.status = r->status;
  return a;
}

Result<std::string> http_get_body(const std::string& host, int port, const std::string& path, int timeout_ms,
                                  size_t max_bytes) {
  AFD_ASSIGN_OR_RETURN(HttpAnswer a, http_get(host, port, path, timeout_ms, max_bytes));
  if (a.status != 200)
    return unavailable(host + ":" + std::to_string(port) + path + ": answered " + std::to_string(a.status));
  return std::move(a.body);
}

}  // namespace afd::serve
