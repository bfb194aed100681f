#include "comm/socket_util.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/timer.h"

namespace afd::comm {

namespace {
std::string os_error(const std::string& what, int err) { return what + ": " + std::strerror(err); }

Result<sockaddr_in> resolve(const HostPort& hp) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(hp.port);
  if (hp.host.empty() || hp.host == "0.0.0.0" || hp.host == "*") {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    return sa;
  }
  if (inet_pton(AF_INET, hp.host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(hp.host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) return unavailable("cannot resolve host '" + hp.host + "': " + gai_strerror(rc));
  sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return sa;
}

int wait_fd(int fd, short events, int64_t deadline_ns) {
  int64_t left = deadline_ns - now_ns();
  if (left <= 0) return 0;
  pollfd p{fd, events, 0};
  int ms = static_cast<int>(std::min<int64_t>(left / 1000000 + 1, 1000));
  return ::poll(&p, 1, ms);
}
}  // namespace

Result<HostPort> parse_host_port(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return invalid_argument("address '" + address + "' is not host:port");
  HostPort hp;
  hp.host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  char* end = nullptr;
  long v = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || v < 0 || v > 65535) {
    return invalid_argument("address '" + address + "' has an invalid port");
  }
  hp.port = static_cast<uint16_t>(v);
  return hp;
}

Result<int> tcp_listen(const std::string& address, uint16_t* port) {
  AFD_ASSIGN_OR_RETURN(HostPort hp, parse_host_port(address));
  AFD_ASSIGN_OR_RETURN(sockaddr_in sa, resolve(hp));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return io_error(os_error("socket()", errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    int e = errno;
    ::close(fd);
    return io_error(os_error("cannot bind " + address, e));
  }
  if (::listen(fd, 64) != 0) {
    int e = errno;
    ::close(fd);
    return io_error(os_error("cannot listen on " + address, e));
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  if (port) *port = ntohs(sa.sin_port);
  return fd;
}

Result<int> tcp_connect(const std::string& address, int timeout_ms) {
  AFD_ASSIGN_OR_RETURN(HostPort hp, parse_host_port(address));
  AFD_ASSIGN_OR_RETURN(sockaddr_in sa, resolve(hp));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return io_error(os_error("socket()", errno));
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  if (rc != 0 && errno != EINPROGRESS) {
    int e = errno;
    ::close(fd);
    return unavailable(os_error("cannot connect to " + address, e));
  }
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    int n = ::poll(&p, 1, timeout_ms);
    int err = 0;
    socklen_t len = sizeof err;
    if (n <= 0) {
      ::close(fd);
      return unavailable("cannot connect to " + address + ": timed out");
    }
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      ::close(fd);
      return unavailable(os_error("cannot connect to " + address, err));
    }
  }
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  return fd;
}

Result<int> tcp_accept(int listen_fd, int timeout_ms) {
  pollfd p{listen_fd, POLLIN, 0};
  int n = ::poll(&p, 1, timeout_ms);
  if (n <= 0) return -1;
  int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return -1;
    return io_error(os_error("accept()", errno));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  return fd;
}

Status send_all(int fd, const void* data, size_t n, int64_t deadline_ns) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (wait_fd(fd, POLLOUT, deadline_ns) <= 0) {
      if (now_ns() >= deadline_ns) return timeout_error("bootstrap socket send timed out");
      continue;
    }
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return unavailable(os_error("bootstrap socket send", errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status();
}

Status recv_all(int fd, void* data, size_t n, int64_t deadline_ns) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (wait_fd(fd, POLLIN, deadline_ns) <= 0) {
      if (now_ns() >= deadline_ns) return timeout_error("bootstrap socket receive timed out");
      continue;
    }
    ssize_t k = ::recv(fd, p, n, 0);
    if (k == 0) return unavailable("bootstrap socket closed by the peer");
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return unavailable(os_error("bootstrap socket receive", errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status();
}

void close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace afd::comm
