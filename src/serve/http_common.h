// HTTP plumbing shared by the engine server (HttpServer) and the engine-less front end
// (Frontend): listener options and binding, connection settings, the API-key check,
// OpenAI-style error answers and the cpp-httplib error / exception handlers.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>

#include "core/status.h"

namespace httplib {
class Server;
struct Response;
}  // namespace httplib

namespace afd::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port
  std::string api_key;              // empty: no authentication
  size_t max_body_bytes = 1 << 20;  // larger bodies get 413
  int http_threads = 512;           // concurrent connections being served
  int retry_after_s = 1;            // Retry-After on 429 / 503
};

// Sets status and an OpenAI-style error body; 429 and 503 also get Retry-After.
void send_error(httplib::Response& res, int status, const std::string& msg, int retry_after_s);

// Constant-time comparison for secrets: the time depends on the lengths only.
bool constant_time_equal(const std::string& a, const std::string& b);

// Everything both servers set before their routes: http_threads workers, the body limit,
// keep-alive and timeouts; with an API key, /v1/* requires `Authorization: Bearer KEY`
// (compared in constant time; a refusal answers 401 and calls on_unauthorized, e.g. to count
// it); routes without a handler (404), bodies over the limit (413) and other protocol errors
// get an OpenAI-style JSON body; an exception escaping a handler becomes a logged 500 (never
// an abort). `who` names the server in the log line.
void configure_server(httplib::Server& s, const ServerOptions& o, const std::string& who,
                      std::function<void()> on_unauthorized);

// Binds o.host:o.port (port 0: any free port) and returns the bound port; io_error naming
// the address when that fails. Also ignores SIGPIPE: a client that disconnects mid-write
// must not kill the process.
Result<int> bind_server(httplib::Server& s, const ServerOptions& o);

// Runs a bound server's listening loop so that stop() ends it whenever stop() comes: before
// run(), while run() is starting to listen, or while it listens. (httplib ignores a stop()
// that precedes its loop, and must not be stopped twice.)
class ListenLoop {
 public:
  explicit ListenLoop(httplib::Server* s) : s_(s) {}
  // Blocks until stop(); false if the loop ended without a stop() (the socket failed).
  bool run();
  // Thread-safe, idempotent; returns once the loop is told to end (not when run() returns).
  void stop();

 private:
  httplib::Server* s_;
  std::mutex mu_;
  bool stopping_ = false, listening_ = false;  // mu_
  std::atomic<bool> exited_{false}, stopped_{false};
};

}  // namespace afd::serve
