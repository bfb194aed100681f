// HTTP plumbing shared by the OpenAI-compatible API (ApiServer, of the engine server and of
// the engine-less front end) and the FFN worker's StatusServer, over the one HTTP layer
// (serve/http/): listener options and limits, the API-key check, OpenAI-style error answers
// and the exception handler.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "serve/api/admission.h"
#include "serve/http/limits.h"
#include "serve/http/message.h"

namespace afd::serve {

namespace http {
class Server;
struct Options;
}  // namespace http

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;         // 0: any free port
  std::string api_key;     // empty: no authentication
  int http_threads = 512;  // requests in handlers at once (a generation holds one until it ends)
  int retry_after_s = 1;   // Retry-After on 429 / 503
  // Role-injection defence: control-token text inside chat message content is tokenized as
  // plain text (RequestLimits::content_special_as_text). Default: as Hugging Face does.
  bool content_special_as_text = false;
  // What a client may send and how long it may take (body 413, header 431, target 414,
  // deadlines 408, connections): serve/http/limits.h.
  http::Limits limits;
  // Where bodies are parsed and tokenized: large ones at background CPU priority
  // (serve/api/admission.h).
  AdmissionOptions admission;
};

// The 503 reason when the admission lane for large bodies is full (serve/api/admission.h).
inline constexpr const char* kAdmissionFull =
    "too many large request bodies are being parsed at once; retry later";

// Sets status and an OpenAI-style error body; 429 and 503 also get Retry-After.
void send_error(http::Response& res, int status, const std::string& msg, int retry_after_s);

// Constant-time comparison for secrets: the time depends on the lengths only.
bool constant_time_equal(const std::string& a, const std::string& b);

// The HTTP layer's options for `o`: limits, http_threads handler threads, OpenAI-style
// bodies for the errors it answers itself (limits, 404/405). `who` names it in log lines.
http::Options http_options(const ServerOptions& o, const std::string& who);

// Everything every server sets before its routes: with an API key, /v1/* and /admin/*
// require `Authorization: Bearer KEY` (compared in constant time; a refusal answers 401 and,
// for /v1/*, calls on_unauthorized, e.g. to count it); an exception escaping a handler becomes a logged 500
// with an OpenAI-style body (never an abort). `who` names the server in the log line.
void configure_server(http::Server& s, const ServerOptions& o, const std::string& who,
                      std::function<void()> on_unauthorized);

// Binds o.host:o.port (port 0: any free port) and returns the bound port; io_error naming
// the address when that fails. Also ignores SIGPIPE: a client that disconnects mid-write
// must not kill the process (the server's own writes never raise it; clients' may).
Result<int> bind_server(http::Server& s, const ServerOptions& o);

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

}  // namespace afd::serve
