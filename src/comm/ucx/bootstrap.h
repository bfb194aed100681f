// The bootstrap handshake of two UCX transports over a connected TCP socket.
//
// Round 1, both ways: a 12-byte header {u32 magic "AFDB", u16 version, u16 name_len,
// u32 addr_len} (host byte order), then the name (1..255 bytes) and the ucp worker address
// (1 byte .. 1 MiB). Round 2, both ways: a u32 holding the 16-bit source field the sender
// gave the receiver (its connection stamp, bits 10..15, is never 0).
// Every step has one deadline; a peer that is not an afd transport, speaks another
// version, or sends out-of-range lengths is refused with corrupt_data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace afd::comm::ucx {

constexpr uint32_t kBootMagic = 0x42444641u;  // "AFDB"
// 2: the source field carries a connection stamp.
constexpr uint16_t kBootVersion = 2;

struct Hello {
  std::string name;
  std::vector<uint8_t> worker_address;
};

// Round 1: sends `mine`, returns the peer's. `dialed` (empty for an accepted socket) and
// `timeout_ms` only word the error when the peer says nothing.
Result<Hello> exchange_hello(int fd, const Hello& mine, int64_t deadline_ns, const std::string& dialed,
                             int timeout_ms);
// Round 2: sends the source field we give the peer, returns the one it gives us.
Result<uint16_t> exchange_source_fields(int fd, uint16_t mine, int64_t deadline_ns);

}  // namespace afd::comm::ucx
