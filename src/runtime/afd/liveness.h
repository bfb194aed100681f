// AFD liveness probes (docs/PROTOCOL.md, "Liveness"), the parts the attention side
// (FfnClient pings) and the FFN side (FfnWorker answers) share: the tag and header-only
// buffers, the pong an FFN worker answers a ping with, what an attention worker makes of a
// pong receive, and when a ping in flight is overdue.
#pragma once

#include <atomic>
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

// Attention side: the liveness probe of one FFN worker, at most one ping in flight. One
// thread drives it (FfnClient's monitor); sent_ns and answered may be read from any thread.
struct PeerProbe {
  ProbeBuffers buf;
  comm::RequestId ping_id = 0, pong_id = 0;
  bool ping_live = false, pong_live = false;
  comm::PeerId peer = comm::kNoPeer;  // the ping in flight went to
  uint64_t seq = 0;                   // of the ping in flight
  bool overdue = false;               // unanswered past the timeout (reported once)
  int64_t next_ns = 0;                // when the next ping may go
  std::atomic<int64_t> sent_ns{0};    // when the unanswered ping went; 0 when none
  std::atomic<int64_t> answered{0};   // pongs received

  // What one reap saw, for the caller to log and record.
  struct Reaped {
    bool answered = false;       // the pong of the ping in flight came
    bool back = false;           // ... after it had become overdue, this long after the ping:
    int64_t back_after_ms = 0;
    std::string bad_pong;        // a malformed pong (the worker still owes the ping)
    bool became_overdue = false; // the ping in flight just passed timeout_ms unanswered
  };
  // Takes the completions of the ping and pong in flight at `now`: an answered or lost ping
  // lets the next one go `interval_ns` later; an answer that does not match is waited for
  // again. Then marks the ping in flight overdue once past timeout_ms.
  Reaped reap(comm::Transport* t, int64_t now, int64_t interval_ns, int64_t timeout_ms);
  // A pong is awaited (a ping is in flight).
  bool awaiting() const { return pong_live; }
  // The next ping may go.
  bool due(int64_t now) const { return !pong_live && !ping_live && now >= next_ns; }
  // Sends the next ping to `to` at `now` (the one after it is due `interval_ns` later) when
  // `to` is connected. Returns whether a ping is in flight.
  bool ping(comm::Transport* t, comm::PeerId to, int64_t now, int64_t interval_ns);
  // Ends the operations in flight.
  void stop(comm::Transport* t);
};

}  // namespace afd
