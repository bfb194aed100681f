// The limits every afd HTTP server enforces on what a client sends, with their defaults.
// The matching `afd serve` / `afd worker` flags are in apps/serve_stack.cpp; docs/SERVING.md
// lists them.
#pragma once

#include <cstddef>

namespace afd::serve::http {

struct Limits {
  // Decoded request body, whatever the transfer encoding (Content-Length or chunked): 413.
  size_t max_body_bytes = 1 << 20;
  // Request line + header fields (and a chunked body's trailer): 431.
  size_t max_header_bytes = 16 << 10;
  // Header fields per request (trailer fields included): 431.
  int max_headers = 100;
  // Request-target (path + query): 414.
  size_t max_target_bytes = 8 << 10;
  // From the first byte of a request to the end of its header: 408, then closed.
  double header_timeout_s = 10;
  // From the end of the header to the end of the body: 408, then closed.
  double body_timeout_s = 30;
  // Keep-alive: from the end of a response to the first byte of the next request (closed).
  double idle_timeout_s = 30;
  // A response write that makes no progress for this long fails (the connection is closed;
  // a streaming handler sees its sink.write() return false).
  double write_timeout_s = 30;
  // Connections open at once; one over it gets 503 and is closed.
  int max_connections = 2048;
};

}  // namespace afd::serve::http
