// What an HTTP handler sees of one exchange: the parsed Request, the Response it fills (a
// body, or a chunked content provider that streams), and the DataSink a provider writes to.
// Plain types with no Boost in sight: handlers and the servers' headers include only this.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace afd::serve::http {

// ASCII case-insensitive equality (HTTP field names, tokens).
bool iequals(std::string_view a, std::string_view b);

// Header fields in arrival order; names compare case-insensitively.
using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;   // as sent, e.g. "POST"
  std::string target;   // request-target as sent, e.g. "/v1/models?x=1"
  std::string path;     // target up to '?', not percent-decoded: routes match it exactly
  int version = 11;     // 10: HTTP/1.0, 11: HTTP/1.1
  Headers headers;
  std::string body;     // decoded (chunked framing removed), at most the body limit
  bool keep_alive = true;  // what the client asked for (Connection, version)
  std::string remote_addr;  // numeric peer address
  int remote_port = -1;
  // The connection's socket while the handler runs (the server neither closes nor reads it
  // meanwhile), for client_gone(); -1 outside a server.
  int socket = -1;

  // First value of the field `name` (any case), or "" when absent.
  std::string get_header_value(std::string_view name) const;
  bool has_header(std::string_view name) const;
  // Whether the client has closed or shut down its side of the connection (end of stream,
  // POLLRDHUP or a socket error). Readable data is a pipelined next request: still there.
  // For handlers that wait long before answering (cancel work nobody will read). Cheap: one
  // poll() with a zero timeout.
  bool client_gone() const;
};

// Where a chunked content provider writes. write() sends one chunk (n > 0) and returns
// false once the client is gone or accepts no byte within the write timeout; done() ends
// the body. Both may only be called from inside the provider.
struct DataSink {
  std::function<bool(const char* data, size_t n)> write;
  std::function<void()> done;
};

// Called repeatedly (offset: bytes written so far) on the handler's thread until it calls
// sink.done() (success) or returns false (abort: the connection is closed). It may block,
// e.g. waiting for the next token.
using ContentProvider = std::function<bool(size_t offset, DataSink& sink)>;
// Called once after a provider's stream ended: true if done() was reached and every write
// succeeded.
using ContentProviderReleaser = std::function<void(bool success)>;

struct Response {
  int status = 200;
  Headers headers;  // Content-Type, Content-Length, Transfer-Encoding, Connection are the server's
  std::string body;
  std::string content_type;
  ContentProvider provider;  // set: the body is streamed (chunked) instead of `body`
  ContentProviderReleaser releaser;

  void set_header(std::string name, std::string value);
  std::string get_header_value(std::string_view name) const;
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  void set_chunked_content_provider(std::string type, ContentProvider p, ContentProviderReleaser r = {}) {
    content_type = std::move(type);
    provider = std::move(p);
    releaser = std::move(r);
  }
};

using Handler = std::function<void(const Request&, Response&)>;

}  // namespace afd::serve::http
