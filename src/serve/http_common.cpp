#include "serve/http_common.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <exception>
#include <thread>

#include <httplib.h>
#include <sys/socket.h>

#include "core/log.h"
#include "serve/response.h"

namespace afd::serve {

void send_error(httplib::Response& res, int status, const std::string& msg, int retry_after_s) {
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

void configure_server(httplib::Server& s, const ServerOptions& o, const std::string& who,
                      std::function<void()> on_unauthorized) {
  const int n_threads = std::max(1, o.http_threads);
  s.new_task_queue = [n_threads] { return new httplib::ThreadPool(static_cast<size_t>(n_threads)); };
  s.set_payload_max_length(o.max_body_bytes);
  s.set_keep_alive_max_count(1000);
  s.set_keep_alive_timeout(30);
  s.set_read_timeout(30, 0);
  s.set_write_timeout(30, 0);
  s.set_tcp_nodelay(true);
  // SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT, with which a second
  // server on a port in use binds without error and the kernel splits the connections
  // between the two processes. Now that is "address in use" (bind_server's io_error).
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  s.set_pre_routing_handler([key = o.api_key, retry = o.retry_after_s, on_unauthorized](
                                const httplib::Request& req, httplib::Response& res) {
    if (key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) == 0 && constant_time_equal(auth.substr(prefix.size()), key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "invalid or missing API key (Authorization: Bearer <key>)", retry);
    if (on_unauthorized) on_unauthorized();
    return httplib::Server::HandlerResponse::Handled;
  });

  const size_t max_body_bytes = o.max_body_bytes;
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

Result<int> bind_server(httplib::Server& s, const ServerOptions& o) {
  std::signal(SIGPIPE, SIG_IGN);
  if (o.port == 0) {
    const int p = s.bind_to_any_port(o.host);
    if (p <= 0) return io_error("cannot bind " + o.host + " (any port)");
    return p;
  }
  if (!s.bind_to_port(o.host, o.port))
    return io_error("cannot bind " + o.host + ":" + std::to_string(o.port) + " (in use, or not an address of this host)");
  return o.port;
}

bool ListenLoop::run() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return true;
    listening_ = true;
  }
  const bool ok = s_->listen_after_bind();
  exited_.store(true);
  std::lock_guard<std::mutex> l(mu_);
  return ok || stopping_;
}

void ListenLoop::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    if (!listening_) return;  // run() will see stopping_ and not listen
  }
  // run() is listening or about to: wait for httplib's loop (it starts within microseconds),
  // then stop it, once.
  for (int i = 0; i < 2000 && !s_->is_running() && !exited_.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!exited_.load() && !stopped_.exchange(true)) s_->stop();
}

}  // namespace afd::serve
