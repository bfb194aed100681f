// ClientExchange: one HTTP/1.1 exchange as a client, on Boost.Beast's parser and Boost.Asio
// like the server (serve/http/server.h). It sends one request on a new connection
// (Connection: close) and delivers the response's status and headers, then its body as the
// bytes arrive (chunked framing removed), so a caller can read an SSE stream as it comes.
// Every wait is bounded: connecting by connect_ms, each wait to send the next piece of the
// request by write_ms, and each wait for the next response byte by read_ms. cancel() from any
// thread ends the exchange and closes the connection. Plain types: no Boost in this header.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "serve/http/message.h"

namespace afd::serve::http {

struct ClientTimeouts {
  int connect_ms = 2000;
  int write_ms = 30000;  // longest wait to send the next piece of the request
  int read_ms = 30000;   // longest wait for the next response byte
};

struct ResponseHead {
  int status = 0;
  Headers headers;
  // First value of the field `name` (any case), or "" when absent.
  std::string get_header_value(std::string_view name) const;
};

// How an exchange ended.
enum class ClientEnd {
  completed,        // the whole response arrived
  cancelled,        // a callback returned false, or cancel()
  unreachable,      // the host did not resolve, or the connection was refused or unreachable
  connect_timeout,  // no connection within connect_ms
  write_failed,     // sending failed (connection closed or reset) or a piece waited write_ms
  read_timeout,     // no response byte for read_ms
  closed,           // the peer closed or reset the connection before the response ended
  malformed,        // the response is not valid HTTP/1.1 (detail says how)
};

struct ClientOutcome {
  ClientEnd end = ClientEnd::completed;
  bool responded = false;  // the status line and headers arrived (on_head ran)
  std::string detail;      // the system's or the parser's words for a failure; may be empty
};

class ClientExchange {
 public:
  ClientExchange(std::string host, int port, ClientTimeouts t);
  ~ClientExchange();
  ClientExchange(const ClientExchange&) = delete;
  ClientExchange& operator=(const ClientExchange&) = delete;

  // Sends `method target` with `headers` (Host, Content-Length for a body, and Connection:
  // close are added) and `body`, then reads the answer: on_head once when the status line and
  // headers arrive, on_data for each piece of the body; either returning false ends the
  // exchange (cancelled; the connection is closed). Blocks until the end; call once.
  ClientOutcome run(const std::string& method, const std::string& target, const Headers& headers,
                    const std::string& body, const std::function<bool(const ResponseHead&)>& on_head,
                    const std::function<bool(const char*, size_t)>& on_data);
  // Thread-safe; idempotent. Ends a run() in progress (or makes a later one end at once).
  void cancel();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace afd::serve::http
