// UCX transport: one ucp worker per transport, tagged messages (ucp_tag_send_nbx /
// ucp_tag_recv_nbx) over whatever UCX selects (shared memory, TCP, RDMA; UCX_TLS etc.
// are honoured as usual).
//
// Connection set-up: workers start in any order. listen("host:port") opens a TCP
// bootstrap socket; connect("host:port") dials it (retrying with back-off and logging
// what it waits for). Over that socket both sides exchange {name, ucp worker address}
// and the 16-bit source field each gives the other (ucx/bootstrap.h); then both create a
// ucp endpoint. The socket stays open as a liveness channel: its EOF (or a UCX endpoint
// error) is a disconnect. A peer that reconnects under the same name gets its old PeerId
// back.
//
// Wire tag = source field the receiver gave the sender << 48 | user tag, so receives
// match per peer and per connection (ucx/wire.h).
//
// Threads: one progress thread and the callers share the ucp worker
// (UCS_THREAD_MODE_SINGLE, behind one lock: ucx/worker_lock.h). A caller blocked in
// wait() drives the worker itself for waiter_spin_ns, like ucx_perftest's single thread
// (yielding its core about once a microsecond after the first 20 us, so a thread woken on
// that core can run), while the progress thread stays parked off the CPU; when the caller
// gives up, or leaves with other operations still in flight, it hands progress back to
// the progress thread. Otherwise the progress thread polls (yielding) for
// progress_spin_ns after the last activity, then sleeps on the worker's event fd. Posts
// run directly on the caller's thread when the worker is free, else are queued to whoever
// drives it next. A bootstrap thread accepts and dials.
#pragma once

#include <memory>
#include <string>

#include "comm/transport.h"

namespace afd::comm {

struct UcxOptions {
  std::string name;                // this transport's peer name (unique in the deployment)
  int64_t progress_spin_ns = 2000000;  // progress thread polls this long after activity
  // Callers of wait() drive the worker this long, then sleep. Long enough to cover a
  // rendezvous message of a few hundred KiB (an a2f frame of 128 tokens); a waiter that
  // gives up earlier pays a hand-off to the progress thread and a wake-up per message.
  // Lower it (`--ucx-spin-us`) when workers share fewer cores than they have waiting threads.
  int64_t waiter_spin_ns = 200000;
  // waiter_spin_ns from a --ucx-spin-us value; a negative one keeps the default.
  void set_waiter_spin_us(int64_t us) {
    if (us >= 0) waiter_spin_ns = us * 1000;
  }
  int connect_retry_ms = 200;          // first retry interval (doubles up to 2 s)
  int bootstrap_timeout_ms = 5000;     // address exchange deadline
  // UCP_ERR_HANDLING_MODE_PEER on endpoints. Off by default: dead peers are detected by
  // the bootstrap socket (EOF) in either mode, and PEER mode makes UCX 1.13 select slower
  // transports on loopback (docs/BENCHMARKS.md "Communication").
  bool peer_error_handling = false;
};

class UcxTransport : public Transport {
 public:
  // Creates the ucp context and worker and starts the threads. unavailable if UCX cannot start.
  static Result<std::unique_ptr<UcxTransport>> create(UcxOptions opt);
  // The TCP port listen() bound (useful with "127.0.0.1:0"); 0 before listen().
  virtual uint16_t listen_port() const = 0;
};

}  // namespace afd::comm
