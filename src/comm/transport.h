// Transport: message-oriented, tagged sends and receives of frames between named peers.
//
// The attention<->FFN wire (comm/protocol.h) runs over this interface; the runtime never
// sees which implementation carries it (in-process, UCX, or a fault-injecting wrapper).
//
// Model
// - A transport has a local name. Peers are other transports, known by name; each gets a
//   PeerId on first sight that stays the same across disconnects and reconnects, so buffers
//   and tags prepared for a peer stay valid when it comes back.
// - listen(address) accepts peers; connect(address) reaches one and keeps reconnecting in
//   the background (started in any order; a lost peer is retried until close() or
//   stop_connecting(address)).
//   Connections and losses are reported as PeerEvents (next_event).
// - post_send / post_recv start an operation and return at once; the bytes move on the
//   transport's own progress thread, off the caller's thread. A receive matches the
//   send from `peer` with the same 48-bit user tag (kTagBits); messages from one peer
//   with one tag arrive in order.
// - A send may complete only once the peer has posted a matching receive (rendezvous),
//   so never wait for a send before the peer can post its receive.
// - Completion: test() polls, wait()/wait_any() block until a deadline (now_ns() clock).
//   test()/wait() returning a terminal completion consume the request (an operation that
//   finished inside its post may return an id with nothing to consume, which reads as
//   done every time: RequestTable::finished_id). A deadline that
//   passes leaves the request pending: call cancel() and keep polling until it reaches a
//   terminal state before reusing its buffer (cancellation is asynchronous).
// - Prepare once, post every step: callers allocate their frame buffers once per
//   (layer slot, micro-batch, peer), register_memory() them once, and reuse them.
//
// Threading: every method may be called from any thread concurrently, except that a
// given RequestId is waited on by one thread at a time. Optional completion callbacks run
// on whichever thread completes the request — the transport's progress thread, a thread
// waiting on or posting to it, or (in-process) the peer's posting thread — possibly before
// post_*() returns. They may post to the transport but must not block or wait on it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "core/status.h"

namespace afd::comm {

using PeerId = uint32_t;
constexpr PeerId kNoPeer = 0xffffffffu;
using RequestId = uint64_t;

// User tags carry 48 bits; transports use the upper 16 bits of their wire tag to name the sender.
constexpr int kTagBits = 48;
constexpr uint64_t kTagMask = (uint64_t{1} << kTagBits) - 1;

// What an implementation can do beyond the required methods.
struct TransportCaps {
  bool inter_process = false;      // peers may live in other processes or hosts
  bool registered_memory = false;  // register_memory() pins/maps memory for the NIC or shm
  bool zero_copy = false;          // no intermediate staging copy between sender and receiver buffers
  bool disconnect_peer = false;    // disconnect(peer) is supported
  bool fault_injection = false;    // a FaultTransport (fault_transport.h)
};

enum class PeerEventKind : uint8_t { connected, disconnected };

struct PeerEvent {
  PeerEventKind kind = PeerEventKind::connected;
  PeerId peer = kNoPeer;
  std::string name;    // the peer's local name
  std::string detail;  // why (disconnects), or the address (connects)
};

struct Completion {
  Status status;     // ok, or why the operation failed (unavailable, cancelled, ...)
  size_t bytes = 0;  // bytes received (receives) or sent (sends)
};

// A registered memory range. `handle` is implementation-defined (0 where registration is a no-op).
struct MemoryRegion {
  void* base = nullptr;
  size_t size = 0;
  uint64_t handle = 0;
};

// Called once on the progress thread when an operation posted with it finishes; the
// request is then already released (do not test/wait it).
using CompletionFn = std::function<void(const Completion&)>;

class Transport {
 public:
  virtual ~Transport() = default;

  // ---- required ----
  virtual const char* kind() const = 0;  // "inproc", "ucx", "fault(ucx)"...
  virtual TransportCaps caps() const = 0;
  virtual const std::string& local_name() const = 0;

  // Accepts peers at `address` (implementation-specific: "host:port" for UCX, the local
  // name for in-process). At most once.
  virtual Status listen(const std::string& address) = 0;
  // Starts connecting to the peer at `address`; returns at once. The transport retries
  // until the peer answers, logs what it is waiting for, and reconnects after a loss.
  virtual Status connect(const std::string& address) = 0;

  // PeerId of a peer seen at least once (not_found otherwise).
  virtual Result<PeerId> peer_id(const std::string& name) const = 0;
  virtual std::string peer_name(PeerId peer) const = 0;
  virtual bool is_connected(PeerId peer) const = 0;
  // Pops the next connect/disconnect event; false if none arrived before deadline_ns.
  virtual bool next_event(PeerEvent* ev, int64_t deadline_ns) = 0;

  // `data` must stay valid and unchanged until the send completes.
  virtual Result<RequestId> post_send(PeerId peer, uint64_t tag, const void* data, size_t len,
                                      CompletionFn on_done = {}) = 0;
  // Receives one message of at most `capacity` bytes into `buf` (a longer message fails
  // the receive with resource_exhausted and is dropped).
  virtual Result<RequestId> post_recv(PeerId peer, uint64_t tag, void* buf, size_t capacity,
                                      CompletionFn on_done = {}) = 0;
  // True (and fills *out, consuming the request) when the request has finished.
  virtual bool test(RequestId id, Completion* out) = 0;
  // Blocks until the request finishes (consumed) or deadline_ns passes (status timeout,
  // request left pending).
  virtual Completion wait(RequestId id, int64_t deadline_ns) = 0;
  // Index in `ids` of a finished request (not consumed), or -1 at the deadline.
  virtual int wait_any(std::span<const RequestId> ids, int64_t deadline_ns) = 0;
  // Asks for the request to finish early with status cancelled; asynchronous.
  virtual void cancel(RequestId id) = 0;
  // Stops the progress thread; pending operations finish with cancelled. Idempotent.
  virtual void close() = 0;

  // ---- optional (not_supported by default) ----
  virtual Result<MemoryRegion> register_memory(void* base, size_t size) {
    return not_supported(std::string(kind()) + " transport: register_memory");
  }
  virtual Status deregister_memory(const MemoryRegion& region) {
    return not_supported(std::string(kind()) + " transport: deregister_memory");
  }
  // Drops the connection to `peer` as if it had died (pending operations fail with
  // unavailable); a connect()ed peer is then retried.
  virtual Status disconnect(PeerId peer) {
    return not_supported(std::string(kind()) + " transport: disconnect");
  }
  // Undoes connect(address): the address is no longer dialled, retried or logged about (a
  // dial already under way may still finish). A connection it led to stays up until it is
  // lost, and is then not re-established. connect(address) again starts dialling anew. ok
  // when the address was not being dialled.
  virtual Status stop_connecting(const std::string& address) {
    return not_supported(std::string(kind()) + " transport: stop_connecting " + address);
  }
};

// A thread-safe FIFO of PeerEvents, shared by the transport implementations.
class PeerEventQueue {
 public:
  void push(PeerEvent ev);
  // Pops the oldest event; false if none arrived before deadline_ns (now_ns() clock).
  bool pop(PeerEvent* ev, int64_t deadline_ns);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PeerEvent> events_;
};

// Waits for a connected peer named `name` (consuming events on the way is NOT done: it
// polls is_connected), logging what it waits for every `log_every_s` seconds.
Result<PeerId> wait_for_peer(Transport& t, const std::string& name, int64_t deadline_ns,
                             double log_every_s = 2.0);

}  // namespace afd::comm
