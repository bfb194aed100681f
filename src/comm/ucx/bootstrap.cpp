#include "comm/ucx/bootstrap.h"

#include <cstring>

#include "comm/ucx/wire.h"
#include "comm/socket_util.h"

namespace afd::comm::ucx {

Result<Hello> exchange_hello(int fd, const Hello& mine, int64_t deadline, const std::string& dialed, int timeout_ms) {
  uint8_t hdr[12];
  uint32_t magic = kBootMagic;
  uint16_t ver = kBootVersion, name_len = static_cast<uint16_t>(mine.name.size());
  uint32_t addr_len = static_cast<uint32_t>(mine.worker_address.size());
  std::memcpy(hdr, &magic, 4);
  std::memcpy(hdr + 4, &ver, 2);
  std::memcpy(hdr + 6, &name_len, 2);
  std::memcpy(hdr + 8, &addr_len, 4);
  AFD_RETURN_IF_ERROR(send_all(fd, hdr, sizeof hdr, deadline));
  AFD_RETURN_IF_ERROR(send_all(fd, mine.name.data(), mine.name.size(), deadline));
  AFD_RETURN_IF_ERROR(send_all(fd, mine.worker_address.data(), mine.worker_address.size(), deadline));
  uint8_t rh[12];
  // A listener that is not an afd transport (an HTTP server, say) may accept and then say
  // nothing: say so rather than only "timed out".
  if (Status st = recv_all(fd, rh, sizeof rh, deadline); !st.is_ok()) {
    return st.code() == StatusCode::timeout
               ? timeout_error("no afd handshake from " + (dialed.empty() ? std::string("the peer") : dialed) +
                               " within " + std::to_string(timeout_ms) + " ms (is an afd worker listening there?)")
               : st;
  }
  uint32_t r_magic, r_addr_len;
  uint16_t r_ver, r_name_len;
  std::memcpy(&r_magic, rh, 4);
  std::memcpy(&r_ver, rh + 4, 2);
  std::memcpy(&r_name_len, rh + 6, 2);
  std::memcpy(&r_addr_len, rh + 8, 4);
  if (r_magic != kBootMagic) return corrupt_data("bootstrap: the peer is not an afd ucx transport (bad magic)");
  if (r_ver != kBootVersion) return corrupt_data("bootstrap: peer speaks bootstrap version " + std::to_string(r_ver));
  if (r_name_len == 0 || r_name_len > 255) return corrupt_data("bootstrap: peer name length " + std::to_string(r_name_len));
  if (r_addr_len == 0 || r_addr_len > (1u << 20)) {
    return corrupt_data("bootstrap: peer address length " + std::to_string(r_addr_len));
  }
  Hello theirs;
  theirs.name.assign(r_name_len, '\0');
  theirs.worker_address.resize(r_addr_len);
  AFD_RETURN_IF_ERROR(recv_all(fd, theirs.name.data(), theirs.name.size(), deadline));
  AFD_RETURN_IF_ERROR(recv_all(fd, theirs.worker_address.data(), theirs.worker_address.size(), deadline));
  return theirs;
}

Result<uint16_t> exchange_source_fields(int fd, uint16_t mine16, int64_t deadline) {
  uint32_t mine = mine16, theirs = 0;
  AFD_RETURN_IF_ERROR(send_all(fd, &mine, 4, deadline));
  AFD_RETURN_IF_ERROR(recv_all(fd, &theirs, 4, deadline));
  if (theirs > 0xffffu || (theirs >> kPeerIdBits) == 0) {
    return corrupt_data("bootstrap: peer gave us source field " + std::to_string(theirs));
  }
  return static_cast<uint16_t>(theirs);
}

}  // namespace afd::comm::ucx
