#include "serve/http/server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <sys/resource.h>
#include <sys/socket.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "core/log.h"
#include "serve/http/handler_pool.h"
#include "serve/http/request_reader.h"
#include "serve/http/wire.h"

namespace afd::serve::http {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

constexpr size_t kReadChunk = 16 << 10;
// After an error answer (or a Connection: close), what the client still sends is read and
// dropped for up to this long / this much before the socket is closed, so that closing
// with unread data (a TCP reset) does not destroy the answer before the client reads it.
constexpr double kLingerSeconds = 2;
constexpr size_t kLingerBytes = 1 << 20;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, s)));
}

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

}  // namespace

class Connection;  // defined below, outside the anonymous namespace: Server::Impl holds it

struct Server::Impl {
  explicit Impl(Options o)
      : opt(std::move(o)),
        acceptor(net::make_strand(io)),
        accept_retry(acceptor.get_executor()),
        pool(opt.handler_threads) {
    if (!opt.error_body) opt.error_body = default_error_body;
    opt.io_threads = std::max(1, opt.io_threads);
  }

  struct Route {
    std::string method, path;
    Handler handler;
  };

  Options opt;
  std::vector<Route> routes;
  std::function<bool(const Request&, Response&)> pre_routing;
  std::function<void(const Request&, Response&, std::exception_ptr)> on_exception;

  net::io_context io;
  tcp::acceptor acceptor;
  net::steady_timer accept_retry;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  HandlerPool pool;

  std::mutex mu;  // running, bound; stop() vs run()
  bool running = false, bound = false;
  std::atomic<bool> stopping{false};

  std::mutex conns_mu;
  std::unordered_map<const Connection*, std::weak_ptr<Connection>> conns;
  std::atomic<int> n_conns{0};
  std::atomic<uint64_t> accepted{0}, refused{0}, requests{0}, read_errors{0}, timeouts{0};
  Clock::time_point last_accept_error_log{};

  void accept();
  void refuse(tcp::socket& s);
  void unregister(const Connection* c);
  void close_all();
  void io_run();
  // Route, pre-routing and exceptions: fills res for req (on a handler thread).
  void respond(const Request& req, Response& res);
};

// One TCP connection: reads requests (RequestReader) under the deadlines, hands each to the
// pool, writes the answers, and owns its socket. Everything but the streaming write runs on
// the connection's strand; while a request is in a handler (phase handling) the strand
// leaves the socket alone, so the handler thread may poll and write it directly.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl* s, tcp::socket sock)
      : s_(s), sock_(std::move(sock)), timer_(sock_.get_executor()), reader_(s->opt.limits) {}

  net::any_io_executor executor() { return sock_.get_executor(); }

  void start() {
    error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);
    sock_.non_blocking(true, ec);
    const auto ep = sock_.remote_endpoint(ec);
    if (!ec) {
      remote_addr_ = ep.address().to_string();
      remote_port_ = ep.port();
    }
    idle_since_ = Clock::now();
    process();
  }

  // stop(): closes the connection unless a handler has it (then it closes after the answer).
  void on_server_stop() {
    if (phase_ == Phase::handling || phase_ == Phase::closed) return;
    close();
  }

  void force_close() {
    if (phase_ != Phase::handling) close();
  }

 private:
  enum class Phase { reading, writing, handling, lingering, closed };
  enum class Wait { none, first, idle, header, body, write, linger };

  const Limits& limits() const { return s_->opt.limits; }

  // Parses what is buffered and acts on it: a request to the pool, an interim 100, an error
  // answer, or a wait for more bytes.
  void process() {
    // Request data never reaches an abort: whatever a parse or an allocation throws ends
    // this connection only.
    try {
      process_unguarded();
    } catch (const std::exception& e) {
      spdlog::warn("{}: connection from {} closed: {}", s_->opt.name, remote_addr_, e.what());
      if (phase_ != Phase::handling) close();
    }
  }

  void process_unguarded() {
    if (phase_ == Phase::closed) return;
    if (s_->stopping.load()) return close();
    switch (reader_.next()) {
      case RequestReader::Event::request:
        return dispatch(reader_.take());
      case RequestReader::Event::send_continue:
        return write_bytes("HTTP/1.1 100 Continue\r\n\r\n", After::resume);
      case RequestReader::Event::error: {
        s_->read_errors.fetch_add(1);
        const ReadError& e = reader_.error();
        return answer_and_close(e.status, e.message);
      }
      case RequestReader::Event::need_more:
        return wait_for_bytes();
    }
  }

  void wait_for_bytes() {
    const auto now = Clock::now();
    Wait kind;
    Clock::time_point deadline;
    if (reader_.idle()) {
      reader_.release_memory();
      header_started_ = body_started_ = false;
      kind = first_ ? Wait::first : Wait::idle;
      deadline = idle_since_ + seconds(first_ ? limits().header_timeout_s : limits().idle_timeout_s);
    } else if (!reader_.header_done()) {
      if (!header_started_) {
        header_started_ = true;
        header_start_ = now;
      }
      kind = Wait::header;
      deadline = header_start_ + seconds(limits().header_timeout_s);
    } else {
      if (!body_started_) {
        body_started_ = true;
        body_start_ = now;
      }
      kind = Wait::body;
      deadline = body_start_ + seconds(limits().body_timeout_s);
    }
    phase_ = Phase::reading;
    arm(kind, deadline);
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) { self->on_readable(ec); });
  }

  void on_readable(const error_code& ec) {
    if (phase_ != Phase::reading) return;
    if (ec) return close();
    error_code rec;
    size_t n = 0;
    try {
      char* p = reader_.prepare(kReadChunk);
      n = sock_.read_some(net::buffer(p, kReadChunk), rec);
    } catch (const std::exception& e) {
      spdlog::warn("{}: connection from {} closed: {}", s_->opt.name, remote_addr_, e.what());
      return close();
    }
    reader_.commit(rec ? 0 : n);
    if (rec == net::error::would_block || rec == net::error::try_again || rec == net::error::interrupted)
      return wait_for_bytes();
    if (rec) return close();  // end of stream or reset: nobody to answer
    process();
  }

  void dispatch(Request req) {
    disarm();
    first_ = false;
    header_started_ = body_started_ = false;
    req.remote_addr = remote_addr_;
    req.remote_port = remote_port_;
    req.socket = sock_.native_handle();
    s_->requests.fetch_add(1);
    auto r = std::make_shared<Request>(std::move(req));
    s_->pool.submit([self = shared_from_this(), r] { self->handle_guarded(*r); });
    // The handler's answer comes back through this strand, so it cannot overtake this.
    phase_ = Phase::handling;
  }

  void handle_guarded(const Request& req) {
    try {
      handle(req);
    } catch (const std::exception& e) {
      spdlog::error("{}: answering {} {}: {}", s_->opt.name, req.method, req.path, e.what());
      net::post(executor(), [self = shared_from_this()] { self->after_response(false); });
    }
  }

  // On a handler thread: the answer to req, written here when it streams, else handed back
  // to the strand to be written asynchronously.
  void handle(const Request& req) {
    Response res;
    s_->respond(req, res);
    const bool head = req.method == "HEAD";
    // HTTP/1.0 connections end after one answer (no keep-alive negotiation).
    bool keep = req.keep_alive && req.version >= 11 && !s_->stopping.load();
    if (res.provider && !head) {
      const bool ok = stream(req, res, keep);
      release(res, ok);
      keep = keep && ok && req.version >= 11;
      net::post(executor(), [self = shared_from_this(), keep] { self->after_response(keep); });
      return;
    }
    if (res.provider) release(res, false);  // HEAD: the stream is not produced
    std::string out = response_head(res.status, res.headers, res.content_type, res.body.size(), false, !keep);
    if (!head) out += res.body;
    res = Response{};
    net::post(executor(), [self = shared_from_this(), out = std::move(out), keep]() mutable {
      self->write_bytes(std::move(out), keep ? After::next : After::linger);
    });
  }

  void release(Response& res, bool ok) {
    if (!res.releaser) return;
    try {
      res.releaser(ok);
    } catch (const std::exception& e) {
      spdlog::error("{}: stream releaser: {}", s_->opt.name, e.what());
    } catch (...) {
      spdlog::error("{}: stream releaser threw", s_->opt.name);
    }
  }

  // Streams res.provider's output on this (handler) thread. HTTP/1.1: chunked; HTTP/1.0:
  // raw bytes until the connection closes. True if the provider reached done() and every
  // write went through.
  bool stream(const Request& req, Response& res, bool keep) {
    const int fd = sock_.native_handle();
    const double wt = limits().write_timeout_s;
    const bool chunked = req.version >= 11;
    if (!send_all(fd, response_head(res.status, res.headers, res.content_type, std::nullopt, chunked,
                                    !keep || !chunked),
                  wt))
      return false;
    bool done = false, failed = false;
    size_t offset = 0;
    DataSink sink;
    sink.write = [&](const char* d, size_t n) {
      if (failed || done) return false;
      if (n == 0) return true;
      char size_line[24];
      const int k = std::snprintf(size_line, sizeof size_line, "%zx\r\n", n);
      char crlf[] = "\r\n";
      iovec v[3] = {{size_line, static_cast<size_t>(k)}, {const_cast<char*>(d), n}, {crlf, 2}};
      const bool ok = chunked ? send_all(fd, v, 3, wt) : send_all(fd, &v[1], 1, wt);
      if (!ok) {
        failed = true;
        return false;
      }
      offset += n;
      return true;
    };
    sink.done = [&] {
      if (done || failed) return;
      done = true;
      if (chunked && !send_all(fd, std::string("0\r\n\r\n"), wt)) failed = true;
    };
    while (!done && !failed) {
      bool more = false;
      try {
        more = res.provider(offset, sink);
      } catch (const std::exception& e) {
        spdlog::error("{}: content provider: {}", s_->opt.name, e.what());
      } catch (...) {
        spdlog::error("{}: content provider threw", s_->opt.name);
      }
      if (!more && !done) failed = true;
    }
    return done && !failed;
  }

  // What follows a write: the same request goes on (after a 100 Continue), the next request
  // is read (keep-alive), or the connection ends.
  enum class After { resume, next, linger };

  // Writes `bytes` asynchronously (no-progress deadline: the write timeout), then `after`.
  void write_bytes(std::string bytes, After after) {
    if (phase_ == Phase::closed) return;
    out_ = std::move(bytes);
    out_pos_ = 0;
    after_ = after;
    phase_ = Phase::writing;
    write_more();
  }

  void write_more() {
    arm(Wait::write, Clock::now() + seconds(limits().write_timeout_s));
    sock_.async_write_some(net::buffer(out_.data() + out_pos_, out_.size() - out_pos_),
                           [self = shared_from_this()](const error_code& ec, size_t n) { self->on_written(ec, n); });
  }

  void on_written(const error_code& ec, size_t n) {
    if (phase_ != Phase::writing) return;
    if (ec) return close();
    out_pos_ += n;
    if (out_pos_ < out_.size()) return write_more();
    std::string().swap(out_);
    disarm();
    switch (after_) {
      case After::resume:
        phase_ = Phase::reading;
        return process();
      case After::next:
        return after_response(true);
      case After::linger:
        return after_response(false);
    }
  }

  // A response is complete (written, or streamed by the handler thread).
  void after_response(bool keep) {
    if (phase_ == Phase::closed) return;
    if (s_->stopping.load()) return close();
    if (!keep) return linger();
    idle_since_ = Clock::now();
    phase_ = Phase::reading;
    process();
  }

  // An answer the server decides itself, then the connection ends (its framing cannot be
  // trusted after a refused or malformed request).
  void answer_and_close(int status, const std::string& message) {
    const std::string body = s_->opt.error_body(status, message);
    write_bytes(response_head(status, {}, "application/json", body.size(), false, true) + body, After::linger);
  }

  void linger() {
    if (phase_ == Phase::closed) return;
    if (s_->stopping.load()) return close();
    phase_ = Phase::lingering;
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    reader_.discard();
    arm(Wait::linger, Clock::now() + seconds(kLingerSeconds));
    drain();
  }

  void drain() {
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
      if (self->phase_ != Phase::lingering) return;
      if (ec) return self->close();
      char sink[4096];
      error_code rec;
      for (int i = 0; i < 16; ++i) {
        const size_t n = self->sock_.read_some(net::buffer(sink), rec);
        if (rec) break;
        self->lingered_ += n;
      }
      if ((rec && rec != net::error::would_block && rec != net::error::try_again) || self->lingered_ > kLingerBytes)
        return self->close();
      self->drain();
    });
  }

  void arm(Wait kind, Clock::time_point deadline) {
    if (kind == wait_ && deadline == deadline_ && timer_pending_) return;
    wait_ = kind;
    deadline_ = deadline;
    timer_pending_ = true;
    const uint64_t gen = ++timer_gen_;
    timer_.expires_at(deadline);
    timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
      if (ec || gen != self->timer_gen_) return;
      self->timer_pending_ = false;
      self->on_deadline();
    });
  }

  void disarm() {
    ++timer_gen_;
    timer_pending_ = false;
    wait_ = Wait::none;
    timer_.cancel();
  }

  void on_deadline() {
    switch (wait_) {
      case Wait::header:
      case Wait::body: {
        if (phase_ != Phase::reading) return;
        const bool header = wait_ == Wait::header;
        s_->timeouts.fetch_add(1);
        phase_ = Phase::writing;  // the pending read wait, cancelled now, must not act
        error_code ec;
        sock_.cancel(ec);
        return answer_and_close(
            408, header ? "request header not complete within " + fmt_s(limits().header_timeout_s) +
                              " s (--http-header-timeout-s)"
                        : "request body not complete within " + fmt_s(limits().body_timeout_s) +
                              " s (--http-body-timeout-s)");
      }
      case Wait::first:
      case Wait::idle:
      case Wait::write:
      case Wait::linger:
        if (phase_ != Phase::handling) close();
        return;
      case Wait::none:
        return;
    }
  }

  void close() {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::closed;
    disarm();
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    reader_.discard();
    std::string().swap(out_);
    s_->unregister(this);
  }

  Server::Impl* s_;
  tcp::socket sock_;
  net::steady_timer timer_;
  RequestReader reader_;
  Phase phase_ = Phase::reading;
  Wait wait_ = Wait::none;
  Clock::time_point deadline_{};
  bool timer_pending_ = false;
  uint64_t timer_gen_ = 0;
  bool first_ = true;  // no request yet: the first one's wait counts as a header wait
  bool header_started_ = false, body_started_ = false;
  Clock::time_point idle_since_{}, header_start_{}, body_start_{};
  std::string out_;
  size_t out_pos_ = 0;
  After after_ = After::next;
  size_t lingered_ = 0;
  std::string remote_addr_;
  int remote_port_ = -1;
};

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(io), [this](const error_code& ec, tcp::socket sock) {
    if (ec == net::error::operation_aborted || stopping.load() || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors or memory: wait a little rather than spin on the failing accept.
      const auto now = Clock::now();
      if (now - last_accept_error_log > std::chrono::seconds(10)) {
        spdlog::warn("{}: accept failed: {} (retrying)", opt.name, ec.message());
        last_accept_error_log = now;
      }
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](const error_code& e) {
        if (!e) accept();
      });
      return;
    }
    accepted.fetch_add(1);
    if (n_conns.load() >= opt.limits.max_connections) {
      refuse(sock);
    } else {
      auto c = std::make_shared<Connection>(this, std::move(sock));
      {
        std::lock_guard<std::mutex> l(conns_mu);
        conns.emplace(c.get(), c);
      }
      n_conns.fetch_add(1);
      net::post(c->executor(), [c] { c->start(); });
    }
    accept();
  });
}

void Server::Impl::refuse(tcp::socket& s) {
  refused.fetch_add(1);
  const std::string body =
      opt.error_body(503, "too many open connections (" + std::to_string(opt.limits.max_connections) +
                              ", --http-max-connections)");
  Headers h = {{"Retry-After", "1"}};
  const std::string out = response_head(503, h, "application/json", body.size(), false, true) + body;
  error_code ec;
  s.non_blocking(true, ec);
  (void)::send(s.native_handle(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // best effort
  s.shutdown(tcp::socket::shutdown_both, ec);
  s.close(ec);
}

void Server::Impl::unregister(const Connection* c) {
  std::lock_guard<std::mutex> l(conns_mu);
  if (conns.erase(c) > 0) n_conns.fetch_sub(1);
}

void Server::Impl::close_all() {
  std::vector<std::shared_ptr<Connection>> live;
  {
    std::lock_guard<std::mutex> l(conns_mu);
    for (auto& [p, w] : conns)
      if (auto c = w.lock()) live.push_back(std::move(c));
  }
  for (auto& c : live) net::post(c->executor(), [c] { c->force_close(); });
}

void Server::Impl::io_run() {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      spdlog::error("{}: I/O loop: {}", opt.name, e.what());
    }
  }
}

void Server::Impl::respond(const Request& req, Response& res) {
  try {
    if (pre_routing && pre_routing(req, res)) return;
    const std::string& m = req.method == "HEAD" ? std::string("GET") : req.method;
    bool path_known = false;
    for (const Route& r : routes) {
      if (r.path != req.path) continue;
      path_known = true;
      if (r.method != m) continue;
      r.handler(req, res);
      if (res.status < 100 || res.status > 599) res.status = 500;
      if (res.status >= 400 && res.body.empty() && !res.provider)
        res.set_content(opt.error_body(res.status, "HTTP error " + std::to_string(res.status)), "application/json");
      return;
    }
    if (path_known) {
      std::string allow;
      for (const Route& r : routes)
        if (r.path == req.path) allow += (allow.empty() ? "" : ", ") + r.method;
      res = Response{};
      res.status = 405;
      res.set_header("Allow", allow);
      res.set_content(opt.error_body(405, "method " + req.method + " not allowed on " + req.path + " (allowed: " +
                                              allow + ")"),
                      "application/json");
      return;
    }
    res.status = 404;
    res.set_content(opt.error_body(404, "no route for " + req.method + " " + req.path), "application/json");
  } catch (...) {
    std::exception_ptr ep = std::current_exception();
    res = Response{};
    try {
      if (on_exception) {
        on_exception(req, res, ep);
      } else {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what += std::string(": ") + e.what();
        } catch (...) {
        }
        spdlog::error("{}: {}", opt.name, what);
        res.status = 500;
        res.set_content(opt.error_body(500, what), "application/json");
      }
    } catch (...) {
      res = Response{};
      res.status = 500;
      res.set_content(opt.error_body(500, "internal error"), "application/json");
    }
    res.provider = nullptr;
    res.releaser = nullptr;
    if (res.status < 100 || res.status > 599) res.status = 500;
  }
}

Server::Server(Options o) : impl_(std::make_unique<Impl>(std::move(o))) {}

Server::~Server() {
  stop();
  error_code ec;
  impl_->acceptor.close(ec);
}

void Server::get(const std::string& path, Handler h) { impl_->routes.push_back({"GET", path, std::move(h)}); }
void Server::post(const std::string& path, Handler h) { impl_->routes.push_back({"POST", path, std::move(h)}); }
void Server::set_pre_routing(std::function<bool(const Request&, Response&)> f) { impl_->pre_routing = std::move(f); }
void Server::set_exception_handler(std::function<void(const Request&, Response&, std::exception_ptr)> f) {
  impl_->on_exception = std::move(f);
}

namespace {

// Every connection is a descriptor: raises the soft descriptor limit (up to the hard one) so
// that max_connections can be reached; says so when it cannot (accept() then fails with
// EMFILE before the limit, and is retried).
void make_room_for_connections(int max_connections, const std::string& who) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t want = static_cast<rlim_t>(max_connections) + 256;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
    (void)setrlimit(RLIMIT_NOFILE, &rl);
    (void)getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
    spdlog::warn("{}: open-file limit {} is below --http-max-connections {} + 256: connections beyond it wait "
                 "(raise `ulimit -n`)",
                 who, static_cast<unsigned long long>(rl.rlim_cur), max_connections);
}

}  // namespace

Result<int> Server::bind() {
  Impl& s = *impl_;
  make_room_for_connections(s.opt.limits.max_connections, s.opt.name);
  const std::string where = s.opt.host + ":" + (s.opt.port == 0 ? std::string("any port") : std::to_string(s.opt.port));
  error_code ec;
  tcp::resolver resolver(s.io);
  auto eps = resolver.resolve(s.opt.host, std::to_string(s.opt.port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || eps.empty()) return io_error("cannot bind " + where + ": cannot resolve '" + s.opt.host + "'");
  std::string last;
  for (const auto& e : eps) {
    tcp::acceptor& a = s.acceptor;
    error_code x;
    a.open(e.endpoint().protocol(), x);
    // SO_REUSEADDR only (no SO_REUSEPORT): a second server on a port in use fails to bind
    // rather than sharing the connections with the first.
    if (!x) a.set_option(tcp::acceptor::reuse_address(true), x);
    if (!x) a.bind(e.endpoint(), x);
    if (!x) a.listen(net::socket_base::max_listen_connections, x);
    if (!x) {
      std::lock_guard<std::mutex> l(s.mu);
      s.bound = true;
      return static_cast<int>(a.local_endpoint().port());
    }
    last = x.message();
    error_code y;
    a.close(y);
  }
  if (s.opt.port == 0) return io_error("cannot bind " + where + " (" + last + ")");
  return io_error("cannot bind " + where + " (in use, or not an address of this host: " + last + ")");
}

bool Server::run() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.stopping.load()) return true;
    if (!s.bound || s.running) return false;
    s.running = true;
    s.work.emplace(s.io.get_executor());
  }
  net::post(s.acceptor.get_executor(), [&s] { s.accept(); });
  std::vector<std::thread> io_threads;
  for (int i = 1; i < s.opt.io_threads; ++i) io_threads.emplace_back([&s] { s.io_run(); });
  s.io_run();
  for (std::thread& t : io_threads) t.join();
  // Handlers still running finish; their answers are then written (briefly) and their
  // connections closed; whatever is left after that is closed.
  s.pool.shutdown();
  s.io.restart();
  s.io.run_for(std::chrono::seconds(3));
  s.close_all();
  s.io.restart();
  s.io.run();
  return true;
}

void Server::stop() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> l(s.mu);
  if (s.stopping.exchange(true)) return;
  if (!s.running) return;  // run() sees stopping and returns
  net::post(s.acceptor.get_executor(), [&s] {
    error_code ec;
    s.acceptor.close(ec);
    s.accept_retry.cancel();
  });
  std::vector<std::shared_ptr<Connection>> live;
  {
    std::lock_guard<std::mutex> cl(s.conns_mu);
    for (auto& [p, w] : s.conns)
      if (auto c = w.lock()) live.push_back(std::move(c));
  }
  for (auto& c : live) net::post(c->executor(), [c] { c->on_server_stop(); });
  s.work.reset();
}

bool Server::stopping() const { return impl_->stopping.load(); }

ServerCounters Server::counters() const {
  const Impl& s = *impl_;
  ServerCounters c;
  c.accepted = s.accepted.load();
  c.refused = s.refused.load();
  c.requests = s.requests.load();
  c.read_errors = s.read_errors.load();
  c.timeouts = s.timeouts.load();
  c.open_connections = s.n_conns.load();
  return c;
}

}  // namespace afd::serve::http
