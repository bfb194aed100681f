// Small blocking-with-deadline TCP helpers for the UCX bootstrap (address exchange and
// liveness). Every failure is a Status naming the address and the OS error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace afd::comm {

struct HostPort {
  std::string host;
  uint16_t port = 0;
};
// "host:port" (host may be empty or 0.0.0.0 for listening).
Result<HostPort> parse_host_port(const std::string& address);

// A listening socket bound to `address`; the bound port is written to *port (useful for ":0").
Result<int> tcp_listen(const std::string& address, uint16_t* port);
// Connects within timeout_ms; the socket is returned in blocking mode.
Result<int> tcp_connect(const std::string& address, int timeout_ms);
// Accepts one connection if one arrives within timeout_ms (-1 with ok status if none).
Result<int> tcp_accept(int listen_fd, int timeout_ms);
// Sends / receives exactly n bytes before deadline_ns (now_ns() clock).
Status send_all(int fd, const void* data, size_t n, int64_t deadline_ns);
Status recv_all(int fd, void* data, size_t n, int64_t deadline_ns);
void close_fd(int fd);

}  // namespace afd::comm
