// AFD liveness probes (docs/PROTOCOL.md, "Liveness"), the parts the attention side
// (FfnClient pings) and the FFN side (FfnWorker answers) share: the tag and header-only
// buffers, the pong an FFN worker answers a ping with, what an attention worker makes of a
// pong receive, and when a ping in flight is overdue.
#pragma once

#include <cstdint>
#include <string>

#include "comm/frame_buffer.h"
#include "comm/protocol.h"
#include "comm/transport.h"
#include "core/status.h"

namespace afd {

// The tag of ping and pong frames (its own, never the data path's).
uint64_t probe_tag();

// One endpoint's probe buffers: the ping it sends or receives and the pong it receives or
// sends, header-only frames registered with the transport.
struct ProbeBuffers {
  comm::FrameBuffer ping, pong;
  // Creates both when absent.
  Status ensure(comm::Transport* t);
  bool ready() const { return ping.data() != nullptr; }
};

// Attention side: encodes ping `seq` into b.ping; returns its length.
size_t write_ping(ProbeBuffers& b, uint64_t seq);
// FFN side: the sequence number of a received ping (`bytes` long, in b.ping); corrupt_data
// when it is malformed.
Result<uint64_t> read_ping(const ProbeBuffers& b, size_t bytes);
// FFN side: encodes the pong for ping `seq` into b.pong (whose previous send must have
// completed); returns its length.
size_t write_pong(ProbeBuffers& b, uint64_t seq);

// Attention side: what a completed pong receive (completion c, frame in b.pong) says about
// the ping `seq` in flight.
enum class PongVerdict {
  answered,  // the pong for `seq`
  lost,      // the receive failed (lost connection or cancelled): probe again after reconnecting
  owed,      // a malformed pong or one for an older ping: the worker still owes this one (*why)
};
PongVerdict judge_pong(const comm::Completion& c, const ProbeBuffers& b, uint64_t seq, std::string* why);

// A ping sent at sent_ns (0: none in flight) is overdue at now_ns when unanswered for more
// than timeout_ms.
inline bool probe_overdue(int64_t sent_ns, int64_t now_ns, int64_t timeout_ms) {
  return sent_ns != 0 && now_ns - sent_ns > timeout_ms * 1000000;
}

}  // namespace afd
