// http::Server: the one HTTP/1.1 server of afd (the OpenAI API, the front end, the FFN
// worker's status port), on Boost.Beast's parser and Boost.Asio.
//
// Threads: a few I/O threads (Options::io_threads) read every connection asynchronously
// under the Limits (header and body deadlines, keep-alive idle timeout, sizes), so a slow or
// idle client holds no thread. A complete request goes to a HandlerPool of at most
// Options::handler_threads threads, separate from the I/O threads because generation
// handlers block for long. A fixed answer is written back asynchronously; a streaming one
// (Response::set_chunked_content_provider) is written by its handler's thread, each write
// bounded by the write timeout. One request per connection is in a handler at a time;
// requests sent back to back (pipelining) wait in the connection's buffer and are answered
// in order. Errors the server decides itself (limits, malformed framing, 404/405, a
// handler's exception) get Options::error_body with a status naming the limit; after a
// framing error or a timeout the connection is closed.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "serve/http/limits.h"
#include "serve/http/message.h"

namespace afd::serve::http {

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  Limits limits;
  int handler_threads = 512;  // requests in handlers at once
  int io_threads = 2;
  std::string name = "http server";  // in log lines
  // Body (JSON) of the answers the server makes itself, from status and message.
  std::function<std::string(int status, const std::string& message)> error_body;
};

// Counters since the server started (tests read them; no /metrics series yet).
struct ServerCounters {
  uint64_t accepted = 0;          // connections accepted
  uint64_t refused = 0;           // connections over Limits::max_connections
  uint64_t requests = 0;          // complete requests handed to a handler
  uint64_t read_errors = 0;       // requests refused by a limit or as malformed (4xx/501)
  uint64_t timeouts = 0;          // 408s: header or body deadline
  int open_connections = 0;
};

class Server {
 public:
  explicit Server(Options o);
  // stop()s; run() must have returned (or never been called).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes: exact path match. HEAD is answered by the GET route, without the body. Register
  // before run().
  void get(const std::string& path, Handler h);
  void post(const std::string& path, Handler h);
  // Runs before routing, on every request; returns true when it has answered (res filled).
  void set_pre_routing(std::function<bool(const Request&, Response&)> f);
  // Fills the answer when a handler throws (default: 500 with the exception's message). The
  // exception never leaves the server.
  void set_exception_handler(std::function<void(const Request&, Response&, std::exception_ptr)> f);

  // Binds and listens on host:port; returns the bound port (io_error naming the address).
  Result<int> bind();
  // Serves until stop() (blocks); returns at once if stop() came first. Handlers still
  // running when stop() comes are waited for. false: not bound.
  bool run();
  // Thread-safe, idempotent, at any time: no new connection or request is started, idle
  // connections are closed, and run() returns once the handlers in flight have finished.
  void stop();
  bool stopping() const;

  ServerCounters counters() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace afd::serve::http
