// The UCX tag of a message and the limits it implies.
//
// Wire tag = source field << kTagBits | user tag (kTagBits = 48, transport.h). The 16-bit
// source field is what the receiver gave the sender at the handshake: the PeerId the
// receiver knows the sender by (low kPeerIdBits bits) and a stamp of the connection it was
// given for (the 6 bits above, 1..kStamps, a new one at every connection). UCX matches
// tags worker-wide, whichever endpoint a message came through, so a message that the
// sender's previous connection delivered but nobody received matches no receive posted
// after a reconnect.
#pragma once

#include <cstdint>

#include "comm/transport.h"

namespace afd::comm::ucx {

constexpr int kPeerIdBits = 10;
constexpr PeerId kMaxPeers = PeerId{1} << kPeerIdBits;
constexpr uint8_t kStamps = 63;  // stamps run 1..63; 0 is no connection yet

inline uint64_t wire_tag(uint32_t src_field, uint64_t user_tag) {
  return (static_cast<uint64_t>(src_field) << kTagBits) | user_tag;
}
inline uint16_t source_field(PeerId id, uint8_t stamp) {
  return static_cast<uint16_t>(id | (uint32_t{stamp} << kPeerIdBits));
}

}  // namespace afd::comm::ucx
