// The bytes a server sends: status line and header of a response, chunk framing, and a
// blocking write with a no-progress timeout for the handler threads that stream.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <optional>
#include <string>

#include "serve/http/message.h"

namespace afd::serve::http {

// "OK", "Not Found", ...; "Unknown" for a code without a phrase here.
const char* reason_phrase(int status);

// Status line and header block (ending in the empty line) of an HTTP/1.1 response.
// content_length: a Content-Length field; none with chunked: Transfer-Encoding: chunked;
// neither: the body ends when the connection closes (HTTP/1.0 streaming). close adds
// Connection: close. `extra` fields are written as given, less CR/LF and the fields the
// server owns (Content-Length, Transfer-Encoding, Connection).
std::string response_head(int status, const Headers& extra, const std::string& content_type,
                          std::optional<size_t> content_length, bool chunked, bool close);

// {"error":{"message":...,"code":status}}: the layer's own error body unless the server is
// given another one.
std::string default_error_body(int status, const std::string& message);

// Writes all of iov[0..n) to the non-blocking socket fd, waiting in poll() while the kernel
// takes nothing; false on an error, or when no byte could be written for timeout_s.
bool send_all(int fd, iovec* iov, int n, double timeout_s);
bool send_all(int fd, const std::string& data, double timeout_s);

}  // namespace afd::serve::http
