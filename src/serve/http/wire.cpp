#include "serve/http/wire.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>

namespace afd::serve::http {

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
  }
}

namespace {

void append_clean(std::string* out, const std::string& s) {
  for (char c : s)
    if (c != '\r' && c != '\n') out->push_back(c);
}

}  // namespace

std::string response_head(int status, const Headers& extra, const std::string& content_type,
                          std::optional<size_t> content_length, bool chunked, bool close) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  if (!content_type.empty()) {
    h += "Content-Type: ";
    append_clean(&h, content_type);
    h += "\r\n";
  }
  for (const auto& [k, v] : extra) {
    if (k.empty() || iequals(k, "Content-Length") || iequals(k, "Transfer-Encoding") || iequals(k, "Connection") ||
        iequals(k, "Content-Type"))
      continue;
    append_clean(&h, k);
    h += ": ";
    append_clean(&h, v);
    h += "\r\n";
  }
  if (content_length) h += "Content-Length: " + std::to_string(*content_length) + "\r\n";
  else if (chunked) h += "Transfer-Encoding: chunked\r\n";
  if (close) h += "Connection: close\r\n";
  h += "\r\n";
  return h;
}

std::string default_error_body(int status, const std::string& message) {
  std::string m;
  for (unsigned char c : message) {
    if (c == '"' || c == '\\') {
      m.push_back('\\');
      m.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      m += b;
    } else {
      m.push_back(static_cast<char>(c));
    }
  }
  return "{\"error\":{\"message\":\"" + m + "\",\"code\":" + std::to_string(status) + "}}";
}

bool send_all(int fd, iovec* iov, int n, double timeout_s) {
  using clock = std::chrono::steady_clock;
  const auto limit = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s));
  auto deadline = clock::now() + limit;
  while (n > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --n;
      continue;
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      size_t left = static_cast<size_t>(w);
      while (left > 0 && n > 0) {
        const size_t take = std::min(left, iov->iov_len);
        iov->iov_base = static_cast<char*>(iov->iov_base) + take;
        iov->iov_len -= take;
        left -= take;
        if (iov->iov_len == 0) {
          ++iov;
          --n;
        }
      }
      deadline = clock::now() + limit;  // progress: the timeout counts from here
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const auto now = clock::now();
    if (now >= deadline) return false;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd, POLLOUT, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(ms, 1, 1000)));
    if (r < 0 && errno != EINTR) return false;
    if (r > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
  }
  return true;
}

bool send_all(int fd, const std::string& data, double timeout_s) {
  iovec v{const_cast<char*>(data.data()), data.size()};
  return send_all(fd, &v, 1, timeout_s);
}

}  // namespace afd::serve::http
