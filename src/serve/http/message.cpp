#include "serve/http/message.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace afd::serve::http {
namespace {

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

const std::string* find(const Headers& h, std::string_view name) {
  for (const auto& [k, v] : h)
    if (iequals(k, name)) return &v;
  return nullptr;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

std::string Request::get_header_value(std::string_view name) const {
  const std::string* v = find(headers, name);
  return v ? *v : std::string();
}

bool Request::has_header(std::string_view name) const { return find(headers, name) != nullptr; }

bool Request::client_gone() const {
  if (socket < 0) return false;
  pollfd p{socket, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  if (!(p.revents & POLLIN)) return false;
  char c;
  const ssize_t n = recv(socket, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void Response::set_header(std::string name, std::string value) {
  for (auto& [k, v] : headers)
    if (iequals(k, name)) {
      v = std::move(value);
      return;
    }
  headers.emplace_back(std::move(name), std::move(value));
}

std::string Response::get_header_value(std::string_view name) const {
  const std::string* v = find(headers, name);
  return v ? *v : std::string();
}

}  // namespace afd::serve::http
