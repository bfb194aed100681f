// UcxTransportImpl: the UCX transport (comm/ucx_transport.h), internal to src/comm/.
//
// One class, its state here, its jobs in one file each:
// - worker.cpp      the ucp context and worker, the progress thread, the command queue, close
// - peers.cpp       the peer table, the bootstrap thread (accept, dial, handshake), endpoints
//                   made and lost
// - liveness.cpp    dead-peer detection: the bootstrap sockets and UCX endpoint errors
// - send_recv.cpp   posting sends and receives, their completion callbacks, cancellation
// - wait.cpp        wait / wait_any: a caller drives the worker while it waits
// - memory.cpp      register_memory / deregister_memory and the handle lookup on posts
// Helpers with one concept each: worker_lock.h (who drives the worker), wire.h (tags),
// bootstrap.h (the handshake's wire format), region_index.h (registered ranges).
//
// Locking: the ucp worker and everything marked "worker lock" below belong to the holder
// of lock_ (WorkerLock). peers_mu_ guards the peer table's names, connected flags, stamps
// and the wanted list; cmd_mu_ the command queue. Order: worker lock, then peers_mu_ or
// cmd_mu_ (never both at once); UCX callbacks run inside worker calls, so with the worker
// lock held.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/request_table.h"
#include "comm/ucx/region_index.h"
#include "comm/ucx/wire.h"
#include "comm/ucx/worker_lock.h"
#include "comm/ucx_transport.h"

namespace afd::comm::ucx {

constexpr uint32_t kMaxInFlight = 8192;  // RequestTable capacity: request slots are < this
// Operations shorter than this go without their registered memory handle: UCX copies
// them (eager short / bcopy) on every transport, so the handle buys nothing and its
// lookup is skipped.
constexpr size_t kMemhMinBytes = 1024;
// Sends up to this size are first offered to UCX for immediate completion (eager: the
// bytes are copied out inside the call); when UCX takes one, the post needs no request
// slot and no operation context, and returns RequestTable::finished_id().
constexpr size_t kImmediateMaxBytes = 8192;
// The progress thread checks the bootstrap sockets at most this often while it runs.
constexpr int64_t kLivenessPeriodNs = 1000000;

inline std::string ucs_error(const char* what, ucs_status_t st) {
  return std::string(what) + ": " + ucs_status_string(st);
}

class UcxTransportImpl;

// The state of one send in flight (user_data of its UCX request; a send that finishes
// inside its post needs none). Pooled by the transport; worker lock.
struct OpCtx {
  UcxTransportImpl* self = nullptr;
  RequestId id = 0;
  PeerId peer = kNoPeer;
  void* req = nullptr;
  bool lost = false;  // its peer was lost: it fails with the peer's lost_why
  // Set while ucp_tag_send_nbx runs: UCX may run the callback inside the call; the poster
  // then frees ctx.
  bool in_post = true;
  bool done = false;
  // Links in the transport's list of live operations (after the post returned in flight).
  OpCtx* live_prev = nullptr;
  OpCtx* live_next = nullptr;
};

// The state of one receive (user_data of its UCX request): one per request slot, in a table
// the transport allocates once (a pending request's slot is not reused, so a receive owns
// its entry from post to completion). Leaner than an OpCtx, as receives are on every
// message's path: no pool, no list — a lost peer or close() scans the table, and a lost
// receive's reason is its peer's (Peer::lost_why). Worker lock.
//
// A receive posted on the caller's thread is first kDeferred: recorded here and handed to
// UCX (ucp_tag_recv_nbx) at the next of: a send posted on this transport (after that send
// is out), a waiter's turn, a pass of the progress thread, a lost peer, or a full deferral
// list (kMaxDeferred). A caller that posts its receive and then its send (the runtime's
// order: results are expected before the dispatch goes) thus sends without paying for the
// receive's post first; a message that arrives meanwhile waits in UCX's unexpected queue
// and is matched when the receive is posted. Deferred receives are posted in the order
// they were made, before any command queued after them, so per-tag order holds.
struct RecvOp {
  enum : uint8_t { kIdle, kDeferred, kPosting, kDoneInPost, kLive };
  UcxTransportImpl* self = nullptr;  // set once
  void* req = nullptr;               // the UCX request while kLive
  RequestId id = 0;
  PeerId peer = kNoPeer;
  uint8_t state = kIdle;
  bool lost = false;
  // While kDeferred: the receive to post.
  void* buf = nullptr;
  size_t len = 0;
  uint64_t user_tag = 0;
};

// The error-handler argument of one endpoint: which peer and connection it belongs to.
struct ErrArg {
  UcxTransportImpl* self;
  PeerId peer;
  uint64_t gen;
};

class UcxTransportImpl final : public UcxTransport {
 public:
  explicit UcxTransportImpl(UcxOptions opt);
  ~UcxTransportImpl() override { close(); }

  Status init();

  const char* kind() const override { return "ucx"; }
  TransportCaps caps() const override {
    TransportCaps c;
    c.inter_process = true;
    c.registered_memory = true;
    c.zero_copy = true;  // UCX moves registered buffers without an application-level staging copy
    c.disconnect_peer = true;
    return c;
  }
  const std::string& local_name() const override { return opt_.name; }
  uint16_t listen_port() const override { return listen_port_.load(); }

  Status listen(const std::string& address) override;
  Status connect(const std::string& address) override;
  Result<PeerId> peer_id(const std::string& name) const override;
  std::string peer_name(PeerId peer) const override;
  bool is_connected(PeerId peer) const override;
  bool next_event(PeerEvent* ev, int64_t deadline_ns) override { return events_.pop(ev, deadline_ns); }
  Result<RequestId> post_send(PeerId peer, uint64_t tag, const void* data, size_t len, CompletionFn on_done = {}) override;
  Result<RequestId> post_recv(PeerId peer, uint64_t tag, void* buf, size_t capacity, CompletionFn on_done = {}) override;
  bool test(RequestId id, Completion* out) override { return table_.test(id, out); }
  Completion wait(RequestId id, int64_t deadline_ns) override;
  int wait_any(std::span<const RequestId> ids, int64_t deadline_ns) override;
  void cancel(RequestId id) override;
  void close() override;
  Result<MemoryRegion> register_memory(void* base, size_t size) override;
  Status deregister_memory(const MemoryRegion& region) override;
  Status disconnect(PeerId peer) override;
  Status stop_connecting(const std::string& address) override;

 private:
  struct Peer {
    std::string name;
    bool connected = false;      // peers_mu_
    uint16_t src_id_there = 0;   // worker lock: the source field the peer gave us (our send tags)
    uint8_t stamp_issued = 0;    // peers_mu_: the stamp of the last source field we gave it
    // worker lock:
    uint16_t recv_src = 0;       // source field of the current connection (0: none yet)
    ucp_ep_h ep = nullptr;
    int fd = -1;                 // the bootstrap socket, kept as the liveness channel
    uint64_t gen = 0;            // connection count: stale endpoint errors name an older one
    std::string lost_why;        // why the last connection was lost (its operations fail with it)
  };
  // Work for the next holder of the worker lock, from a thread that could not take it.
  struct Command {
    enum Kind : uint8_t { send, recv, cancel, add_peer, drop_peer } kind;
    RequestId id = 0;
    PeerId peer = kNoPeer;
    uint64_t tag = 0;
    void* buf = nullptr;
    size_t len = 0;
    std::vector<uint8_t> addr;  // add_peer: remote ucp worker address
    uint16_t src_id_there = 0;
    uint16_t recv_src = 0;  // add_peer: the source field we gave the peer
    int fd = -1;
    std::string detail;
  };
  // A connect()ed address and its dialling state (bootstrap thread).
  struct Wanted {
    std::string address;
    PeerId peer = kNoPeer;
    int64_t next_try = 0;
    int backoff_ms = 0;
    int64_t next_log = 0;
  };

  // ---- worker.cpp: the progress thread and the command queue ----
  void progress_loop();
  // Lock held: one pass over the worker: queued commands, UCX progress, deferred endpoint
  // errors and closes, and the liveness sockets when `now` (a now_ns() reading; 0 skips
  // them) has reached their next check. `drain` repeats ucp_worker_progress until it
  // reports nothing (the progress thread); a waiter makes one call and checks its requests
  // in between, so a completion is seen one progress call sooner.
  bool progress_once(int64_t now, bool drain);
  // Lock held: frees the endpoint-close requests that have finished.
  void reap_closing();
  // Queues a command for the next holder and wakes the progress thread; false (nothing
  // queued) once the transport is closing.
  bool push_command(Command c);
  void handle(Command& c);  // lock held
  // Progress thread, closing: fails what is queued, drops every peer, cancels and
  // abandons what is in flight.
  void shut_down_worker();

  // ---- peers.cpp: peer table, bootstrap thread, endpoints ----
  PeerId intern_peer(const std::string& name);  // peers_mu_ held
  void bootstrap_loop();
  // Handshake on a connected socket, then queues the new endpoint (add_peer).
  Status exchange(int fd, const std::string& dialed, PeerId* out_peer);
  void add_peer(Command& c);                                         // lock held
  void lose_peer(PeerId p, uint64_t gen, const std::string& why);    // lock held
  // Lock held: receives and drops every unexpected message whose source field is
  // `src` (a lost connection's), so it neither matches a later receive nor stays queued.
  void discard_unexpected(uint16_t src, const std::string& name);
  PeerId peer_count() const;

  // ---- liveness.cpp ----
  void check_liveness();             // lock held: polls the bootstrap sockets
  void handle_failed_endpoints();    // lock held: loses the peers err_cb reported
  static void err_cb(void* arg, ucp_ep_h ep, ucs_status_t status);

  // ---- send_recv.cpp: posting and completing operations ----
  // Posts a send or receive: on the caller's thread when the worker lock is free (the
  // message path), else through the command queue (enqueue_command, out of line so the
  // message path keeps a small frame). post_error: why a post's tag or peer is refused.
  Result<RequestId> enqueue(Command::Kind kind, PeerId peer, uint64_t tag, void* buf, size_t len, CompletionFn&& on_done);
  [[gnu::noinline]] Result<RequestId> enqueue_command(Command::Kind kind, PeerId peer, uint64_t tag, void* buf, size_t len,
                                                      CompletionFn&& on_done);
  [[gnu::noinline, gnu::cold]] Status post_error(uint64_t tag, PeerId peer) const;
  void do_send(RequestId id, PeerId peer, uint64_t tag, void* buf, size_t len);  // lock held
  // Lock held: sends now if UCX can complete it inside the call (true), else posts
  // nothing (false: the caller takes the regular path, which also reports errors).
  bool send_now(PeerId peer, uint64_t tag, const void* buf, size_t len);
  void do_recv(RequestId id, PeerId peer, uint64_t tag, void* buf, size_t len);  // lock held
  // Lock held: records a receive to post later (RecvOp's comment; a full list is posted
  // first); false (nothing recorded) when the peer has no endpoint (do_recv then fails it now).
  bool defer_recv(RequestId id, PeerId peer, uint64_t tag, void* buf, size_t len);
  // Lock held: hands every deferred receive to UCX, oldest first.
  void post_deferred();
  // Lock held: posts r's receive to UCX; `counted`: r is already in n_live_ (deferred).
  void start_recv(RecvOp& r, void* buf, size_t len, uint64_t user_tag, bool counted);
  static void send_cb(void* request, ucs_status_t status, void* user_data);  // OpCtx
  static void recv_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);  // RecvOp
  // Lock held: how a receive that UCX ended with `status` (not UCS_OK) failed.
  [[gnu::noinline]] Completion recv_failure(const RecvOp& r, ucs_status_t status) const;
  void finish(OpCtx* ctx, Completion c);
  // Lock held: OpCtx pool (sends), and their live set (by request slot, plus a list for
  // lose_peer and shutdown); n_live_ counts these and the live receives (recv_ops_).
  OpCtx* take_ctx(RequestId id, PeerId peer);
  void give_ctx(OpCtx* ctx);
  void add_live(OpCtx* ctx);
  void remove_live(OpCtx* ctx);
  OpCtx* find_live(RequestId id) const;
  // Lock held: the UCX request of a live operation (send or receive), or null.
  void* live_request(RequestId id) const;
  // Lock held: the ids of the live receives (of `peer`, or all with kNoPeer; a lost
  // peer's are marked lost).
  std::vector<RequestId> live_recvs(PeerId peer, bool mark_lost);
  void cancel_live(const std::vector<RequestId>& ids);  // lock held

  // ---- memory.cpp ----
  // Lock held: passes buf's registered handle to UCX, for kMemhMinBytes and more.
  void add_memh(ucp_request_param_t* param, const void* buf, size_t len);

  UcxOptions opt_;
  // Every completion of a request runs with the worker lock held (UCX callbacks, posts,
  // close) or before its id is known to anyone: complete_exclusive() throughout.
  RequestTable table_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<uint8_t> worker_address_;
  int worker_efd_ = -1;
  int epfd_ = -1;  // the progress thread's idle sleep: worker events, wake fd, bootstrap sockets

  mutable std::mutex peers_mu_;
  std::unique_ptr<Peer[]> peers_{new Peer[kMaxPeers]};
  // Written under peers_mu_; read without it on the post path (peers are only ever added,
  // and a slot's name is set before the count that covers it is published).
  std::atomic<PeerId> n_peers_{0};
  std::unordered_map<std::string, PeerId> peer_ids_;
  std::vector<Wanted> wanted_;
  int listen_fd_ = -1;
  std::atomic<uint16_t> listen_port_{0};

  std::mutex cmd_mu_;
  std::vector<Command> cmds_;
  std::atomic<int> n_cmds_{0};
  std::atomic<bool> stop_{false};
  bool closed_ = false;
  std::mutex close_mu_;

  // Who drives the worker (its contract: worker_lock.h). Guards the ucp worker and every
  // member marked "worker lock".
  WorkerLock lock_{n_cmds_, stop_};

  // ---- worker lock ----
  std::atomic<int> n_live_{0};  // live operations (written under the lock, read anywhere)
  std::unique_ptr<OpCtx*[]> live_{new OpCtx*[kMaxInFlight]()};  // by request slot
  OpCtx* live_head_ = nullptr;
  std::vector<OpCtx*> ctx_pool_;
  std::unique_ptr<RecvOp[]> recv_ops_{new RecvOp[kMaxInFlight]};  // by request slot
  // Slots of the kDeferred receives, oldest first; counted in n_live_.
  static constexpr uint32_t kMaxDeferred = 64;
  uint32_t deferred_[kMaxDeferred] = {};
  uint32_t n_deferred_ = 0;
  std::vector<void*> closing_;  // endpoint-close requests in flight
  std::vector<std::unique_ptr<ErrArg>> err_args_;
  std::vector<std::pair<PeerId, uint64_t>> failed_eps_;  // (peer, gen) from err_cb
  RegionIndex regions_;
  // Next liveness check (now_ns()); set to 0 from the idle sleep (lock not held) to force one.
  std::atomic<int64_t> next_liveness_{0};

  PeerEventQueue events_;

  std::thread progress_;
  std::thread bootstrap_;
};

}  // namespace afd::comm::ucx
