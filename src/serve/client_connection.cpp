#include "serve/client_connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include <httplib.h>

namespace afd::serve {
namespace {

// Numeric host and port of a socket address, as cpp-httplib fills Request::remote_addr.
bool numeric_address(const sockaddr_storage& a, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *host = h;
  *port = std::atoi(p);
  return true;
}

}  // namespace

int connection_socket(const httplib::Request& req) {
  if (req.remote_addr.empty() || req.remote_port <= 0) return -1;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&a), &len) != 0) continue;
    std::string host;
    int port = -1;
    if (!numeric_address(a, len, &host, &port) || port != req.remote_port || host != req.remote_addr) continue;
    if (req.local_port > 0) {
      len = sizeof a;
      if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&a), &len) != 0) continue;
      if (!numeric_address(a, len, &host, &port) || port != req.local_port) continue;
    }
    found = static_cast<int>(fd);
    break;
  }
  closedir(d);
  return found;
}


bool peer_closed(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  if (!(p.revents & POLLIN)) return false;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}


}  // namespace afd::serve
