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

// What a server says with its 503 while it drains (drain(): finishing the requests in
// flight, accepting none) or stops: on /health, and to a new generation request.
inline constexpr const char* kDrainingHealth = "draining: finishing the requests in flight, accepting none";
inline const char* refusal_while_closing(bool stopping) {
  return stopping ? "the server is shutting down" : "the server is draining (shutting down)";
}

// Counts one request in flight on `n` for its scope (or until release()); a server's
// drained() reads n. Raise it before reading the server's draining flag, so that a request
// which saw the flag unset is counted until it is handed on.
class InFlight {
 public:
  explicit InFlight(std::atomic<int>& n) : n_(n) { n_.fetch_add(1); }
  ~InFlight() { release(); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  void release() {
    if (held_) n_.fetch_sub(1);
    held_ = false;
  }

 private:
  std::atomic<int>& n_;
  bool held_ = true;
};

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
