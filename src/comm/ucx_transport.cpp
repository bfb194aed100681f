#include "comm/ucx_transport.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/request_table.h"
#include "comm/socket_util.h"
#include "core/log.h"
#include "core/timer.h"

namespace afd::comm {
namespace {

constexpr uint32_t kBootMagic = 0x42444641u;  // "AFDB"
// 2: the id each side gives the other carries a connection stamp (below).
constexpr uint16_t kBootVersion = 2;
constexpr int kPeerIdBits = 10;
constexpr PeerId kMaxPeers = PeerId{1} << kPeerIdBits;
constexpr uint32_t kMaxInFlight = 8192;  // RequestTable capacity: request slots are < this
// A parked progress thread re-checks this often. It bounds how long an operation posted
// on a caller's thread right after a wait (which found nothing else in flight, so did not
// wake it) goes unprogressed if the caller then computes instead of waiting.
constexpr int kParkTimeoutUs = 250;
// Operations shorter than this go without their registered memory handle: UCX copies
// them (eager short / bcopy) on every transport, so the handle buys nothing and its
// lookup is skipped (the effect at 64 B is within this VM's run-to-run spread).
constexpr size_t kMemhMinBytes = 1024;
// Sends up to this size are first offered to UCX for immediate completion (eager: the
// bytes are copied out inside the call); when UCX takes one, the post needs no request
// slot and no operation context, and returns RequestTable::finished_id().
constexpr size_t kImmediateMaxBytes = 8192;

// Names the calling thread to the worker lock's owner check (a thread-local's address: a
// register-relative address, where std::this_thread::get_id() is a call into libc).
thread_local char t_thread_token;
inline const void* this_thread_token() { return &t_thread_token; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The UCX tag of a message: the 16-bit source field the receiver gave the sender, over the
// user tag. The field is the PeerId the receiver knows the sender by (low kPeerIdBits) and
// a stamp of the connection it was given for (the 6 bits above, 1..63, a new one at every
// connection): a message that the sender's previous connection delivered but nobody
// received matches no receive posted after a reconnect (UCX matches tags worker-wide,
// whichever endpoint a message came through).
uint64_t wire_tag(uint32_t src_id, uint64_t user_tag) { return (static_cast<uint64_t>(src_id) << kTagBits) | user_tag; }
uint16_t source_field(PeerId id, uint8_t stamp) { return static_cast<uint16_t>(id | (uint32_t{stamp} << kPeerIdBits)); }
constexpr uint8_t kStamps = 63;  // stamps run 1..63; 0 is no connection yet

std::string ucs_error(const char* what, ucs_status_t st) { return std::string(what) + ": " + ucs_status_string(st); }

class UcxTransportImpl;

// The state of one send in flight (user_data of its UCX request; a send that finishes
// inside its post needs none). Pooled by the transport and only touched with the worker
// lock held.
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
// message's path: no pool, no list — a lost peer or close() scans the table (rare), and a
// lost receive's reason is its peer's (Peer::lost_why). Worker lock held.
//
// A receive posted on the caller's thread is first kDeferred: recorded here and handed to
// UCX (ucp_tag_recv_nbx, ~170 instructions) at the next of: a send posted on this
// transport (after that send is out), a waiter's turn, a pass of the progress thread, a
// lost peer, or a full deferral list (kMaxDeferred). A caller that posts its receive and
// then its send (the runtime's order: results are expected before the dispatch goes) thus
// sends without paying for the receive's post first; a message that arrives meanwhile
// waits in UCX's unexpected queue and is matched when the receive is posted. Deferred
// receives are posted in the order they were made, before any command queued after them,
// so per-tag order holds.
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

struct ErrArg {
  UcxTransportImpl* self;
  PeerId peer;
  uint64_t gen;
};

class UcxTransportImpl final : public UcxTransport {
 public:
  explicit UcxTransportImpl(UcxOptions opt)
      : opt_(std::move(opt)), table_(kMaxInFlight, std::min<int64_t>(opt_.waiter_spin_ns, 20000)) {
    for (uint32_t i = 0; i < kMaxInFlight; ++i) recv_ops_[i].self = this;
  }
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
  bool next_event(PeerEvent* ev, int64_t deadline_ns) override;
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

  // Callbacks (progress thread).
  static void send_cb(void* request, ucs_status_t status, void* user_data);
  static void recv_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);  // RecvOp
  // Worker lock held: how a receive that UCX ended with `status` (not UCS_OK) failed.
  [[gnu::noinline]] Completion recv_failure(const RecvOp& r, ucs_status_t status) const;
  static void err_cb(void* arg, ucp_ep_h ep, ucs_status_t status);

 private:
  struct Peer {
    std::string name;
    bool connected = false;      // guarded by peers_mu_
    uint16_t src_id_there = 0;   // id the peer gave us: goes into our send tags
    uint8_t stamp_issued = 0;    // guarded by peers_mu_: the stamp of the last id we gave it
    // worker lock held:
    uint16_t recv_src = 0;       // source field of the current connection (0: none yet)
    ucp_ep_h ep = nullptr;
    int fd = -1;
    uint64_t gen = 0;
    std::string lost_why;        // why the last connection was lost (its operations fail with it)
  };
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
  struct Wanted {
    std::string address;
    PeerId peer = kNoPeer;
    int64_t next_try = 0;
    int backoff_ms = 0;
    int64_t next_log = 0;
  };
  struct Region {
    MemoryRegion r;
    ucp_mem_h memh;
  };

  PeerId intern_peer(const std::string& name);  // peers_mu_ held
  // Worker lock held: receives and drops every unexpected message whose source field is
  // `src` (a lost connection's), so it neither matches a later receive nor stays queued.
  void discard_unexpected(uint16_t src, const std::string& name);
  // Posts a send or receive: on the caller's thread when the worker lock is free (the
  // message path), else through the command queue (enqueue_command, out of line so the
  // message path keeps a small frame). post_error: why a post's tag or peer is refused.
  Result<RequestId> enqueue(Command::Kind kind, PeerId peer, uint64_t tag, void* buf, size_t len, CompletionFn&& on_done);
  [[gnu::noinline]] Result<RequestId> enqueue_command(Command::Kind kind, PeerId peer, uint64_t tag, void* buf, size_t len,
                                                      CompletionFn&& on_done);
  [[gnu::noinline, gnu::cold]] Status post_error(uint64_t tag, PeerId peer) const;
  void wake();
  void progress_loop();
  // Progress thread, while a caller drives the worker in wait_any. behind_driver: this
  // thread found the worker held by a caller and sleeps while it stays held, whatever
  // handoff_ says (a waiter that leaves work in flight wakes it; see progress_loop).
  void park(bool behind_driver = false);
  bool should_park();  // progress thread: a caller drives the worker (see waiters_)
  void cancel_live(const std::vector<RequestId>& ids);  // worker lock held
  // One pass over the worker (lock held): queued commands, UCX progress, deferred endpoint
  // errors and closes, and the liveness sockets when `now` (a now_ns() reading; 0 skips
  // them) has reached their next check. `drain` repeats ucp_worker_progress until it
  // reports nothing (the progress thread); a waiter makes one call and checks its requests
  // in between, so a completion is seen one progress call sooner.
  bool progress_once(int64_t now, bool drain);
  // Defined here, on every message's path, so they inline into it.
  bool try_lock_worker() {
    // Also fails for the holder itself (re-entered from a callback): the lock is not recursive.
    if (worker_locked_.load(std::memory_order_relaxed) || worker_locked_.exchange(true, std::memory_order_acquire)) {
      return false;
    }
    owner_.store(this_thread_token(), std::memory_order_relaxed);
    return true;
  }
  void lock_worker();
  void unlock_worker() {
    owner_.store(nullptr, std::memory_order_relaxed);
    worker_locked_.store(false, std::memory_order_release);
  }
  // Holds the worker lock for a scope unless this thread already does (a callback).
  struct WorkerGuard {
    explicit WorkerGuard(UcxTransportImpl& t) : t_(t), mine_(t.owner_.load() != this_thread_token()) {
      if (mine_) t_.lock_worker();
    }
    ~WorkerGuard() {
      if (mine_) t_.unlock_worker();
    }
    WorkerGuard(const WorkerGuard&) = delete;
    WorkerGuard& operator=(const WorkerGuard&) = delete;
    UcxTransportImpl& t_;
    bool mine_;
  };
  void bootstrap_loop();
  Status exchange(int fd, const std::string& dialed, PeerId* out_peer);
  void handle(Command& c);
  void do_send(RequestId id, PeerId peer, uint64_t tag, void* buf, size_t len);
  // Worker lock held: sends now if UCX can complete it inside the call (true), else
  // posts nothing (false: the caller takes the regular path, which also reports errors).
  bool send_now(PeerId peer, uint64_t tag, const void* buf, size_t len);
  void do_recv(RequestId id, PeerId peer, uint64_t tag, void* buf, size_t len);
  // Worker lock held: records a receive to post later (RecvOp's comment; a full list is
  // posted first); false (nothing recorded) when the peer has no endpoint (do_recv then
  // fails it now).
  bool defer_recv(RequestId id, PeerId peer, uint64_t tag, void* buf, size_t len);
  // Worker lock held: hands every deferred receive to UCX, oldest first.
  void post_deferred();
  // Worker lock held: posts r's receive to UCX; `counted`: r is already in n_live_ (deferred).
  void start_recv(RecvOp& r, void* buf, size_t len, uint64_t user_tag, bool counted);
  void add_peer(Command& c);
  void lose_peer(PeerId p, uint64_t gen, const std::string& why);
  void check_liveness();
  void finish(OpCtx* ctx, Completion c);
  // Worker lock held: OpCtx pool (sends), and their live set (by request slot, plus a list
  // for lose_peer and shutdown); n_live_ counts these and the live receives (recv_ops_).
  OpCtx* take_ctx(RequestId id, PeerId peer);
  void give_ctx(OpCtx* ctx);
  void add_live(OpCtx* ctx);
  void remove_live(OpCtx* ctx);
  OpCtx* find_live(RequestId id) const;
  // Worker lock held: the UCX request of a live operation (send or receive), or null.
  void* live_request(RequestId id) const;
  // Worker lock held: the ids of the live receives (of `peer`, or all with kNoPeer; a lost
  // peer's are marked lost).
  std::vector<RequestId> live_recvs(PeerId peer, bool mark_lost);
  ucp_mem_h find_memh(const void* p, size_t n);  // worker lock held
  // Worker lock held: passes buf's registered handle to UCX, for kMemhMinBytes and more.
  void add_memh(ucp_request_param_t* param, const void* buf, size_t len);
  void push_event(PeerEvent ev);

  UcxOptions opt_;
  // Every completion of a request runs with the worker lock held (UCX callbacks, posts,
  // close) or before its id is known to anyone: complete_exclusive() throughout.
  RequestTable table_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<uint8_t> worker_address_;
  int worker_efd_ = -1;
  int epfd_ = -1;
  int wake_fd_ = -1;

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
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
  bool closed_ = false;
  std::mutex close_mu_;

  // Guards the ucp worker and everything below it: held by the progress
  // thread while it progresses, or by a caller that posts directly / helps progress in wait.
  // A test-and-test-and-set flag, not a std::mutex: unlocking is a plain release store
  // (no read-modify-write), and a std::mutex's try_lock + unlock were ~17% of a waiter's
  // polling turn (perf). Nobody sleeps on it, so unlock wakes nobody: try_lock_worker()
  // fails at once, and lock_worker() backs off (pause, yield, then short sleeps), which
  // suits its users (the progress thread outside callers' waits, memory registration,
  // close) since holders keep it for one pass of work at a time.
  std::atomic<bool> worker_locked_{false};
  std::atomic<const void*> owner_{nullptr};  // this_thread_token() of the holder
  // Callers driving the worker in wait_any, so the progress thread stays parked:
  // - waiters_ counts the ones that have waited kClockEvery turns (a locked add and
  //   subtract, ~5 ns each after the stores of a send);
  // - a shorter wait (a 64 B round trip's, typically) only bumps waiter_epoch_ with a plain
  //   store when it takes the worker lock (so under it): the progress thread parks again
  //   while the epoch moved since its last look (park period kParkTimeoutUs);
  // - a waiter that leaves operations in flight (or gives up, or left commands queued)
  //   raises handoff_ and wakes the progress thread, which then runs instead of parking;
  //   a post that leaves one in flight raises it without a wake (seen at the next look).
  std::atomic<int> waiters_{0};
  std::atomic<uint64_t> waiter_epoch_{0};
  std::atomic<bool> handoff_{false};
  uint64_t seen_epoch_ = 0;  // progress thread only
  std::atomic<int> lock_wanted_{0};  // threads blocked in lock_worker()
  std::atomic<int> n_live_{0};  // live operations, readable without the worker lock
  std::unique_ptr<OpCtx*[]> live_{new OpCtx*[kMaxInFlight]()};  // by request slot
  OpCtx* live_head_ = nullptr;
  std::vector<OpCtx*> ctx_pool_;
  std::unique_ptr<RecvOp[]> recv_ops_{new RecvOp[kMaxInFlight]};  // by request slot
  // Slots of the kDeferred receives, oldest first (worker lock held); counted in n_live_.
  static constexpr uint32_t kMaxDeferred = 64;
  uint32_t deferred_[kMaxDeferred] = {};
  uint32_t n_deferred_ = 0;
  std::vector<void*> closing_;
  std::vector<std::unique_ptr<ErrArg>> err_args_;
  std::vector<std::pair<PeerId, uint64_t>> failed_eps_;
  std::atomic<int64_t> next_liveness_{0};  // set to 0 from the epoll path (lock not held) to force a check

  // Registered regions sorted by base (worker lock held), and the largest size seen:
  // find_memh looks back from the last base <= the address no further than that.
  std::vector<Region> regions_;
  size_t max_region_size_ = 0;

  PeerEventQueue events_;

  std::thread progress_;
  std::thread bootstrap_;
};

Status UcxTransportImpl::init() {
  if (opt_.name.empty() || opt_.name.size() > 255) return invalid_argument("ucx transport: name must be 1..255 bytes");
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return unavailable(ucs_error("ucp_config_read", st));
  ucp_params_t params{};
  // No mt_workers_shared: the context's own locks cost ~2-4 us per 64 KiB rendezvous
  // message here (bench_comm); ucp_mem_map / unmap run under the worker lock instead.
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return unavailable(ucs_error("ucp_init", st));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches the worker
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return unavailable(ucs_error("ucp_worker_create", st));
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (st != UCS_OK) return unavailable(ucs_error("ucp_worker_get_address", st));
  worker_address_.assign(reinterpret_cast<uint8_t*>(addr), reinterpret_cast<uint8_t*>(addr) + addr_len);
  ucp_worker_release_address(worker_, addr);
  st = ucp_worker_get_efd(worker_, &worker_efd_);
  if (st != UCS_OK) return unavailable(ucs_error("ucp_worker_get_efd", st));
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wake_fd_ < 0) return io_error("ucx transport: epoll/eventfd creation failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = worker_efd_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, worker_efd_, &ev);
  ev.data.fd = wake_fd_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  progress_ = std::thread([this] { progress_loop(); });
  bootstrap_ = std::thread([this] { bootstrap_loop(); });
  return Status::ok();
}

PeerId UcxTransportImpl::intern_peer(const std::string& name) {
  auto it = peer_ids_.find(name);
  if (it != peer_ids_.end()) return it->second;
  PeerId id = n_peers_.load(std::memory_order_relaxed);
  if (id >= kMaxPeers) return kNoPeer;
  peers_[id].name = name;
  peer_ids_[name] = id;
  n_peers_.store(id + 1, std::memory_order_release);
  return id;
}

Status UcxTransportImpl::listen(const std::string& address) {
  std::lock_guard<std::mutex> lk(peers_mu_);
  if (listen_fd_ >= 0) return invalid_argument("ucx transport '" + opt_.name + "' already listens");
  uint16_t port = 0;
  AFD_ASSIGN_OR_RETURN(int fd, tcp_listen(address, &port));
  listen_fd_ = fd;
  listen_port_ = port;
  spdlog::info("ucx: {} listening for peers on {} (port {})", opt_.name, address, port);
  return Status::ok();
}

Status UcxTransportImpl::connect(const std::string& address) {
  AFD_RETURN_IF_ERROR(parse_host_port(address).status());
  std::lock_guard<std::mutex> lk(peers_mu_);
  for (auto& w : wanted_) {
    if (w.address == address) return Status::ok();
  }
  wanted_.push_back(Wanted{address});
  return Status::ok();
}

Result<PeerId> UcxTransportImpl::peer_id(const std::string& name) const {
  std::lock_guard<std::mutex> lk(peers_mu_);
  auto it = peer_ids_.find(name);
  if (it == peer_ids_.end()) return not_found("ucx transport '" + opt_.name + "' has never seen peer '" + name + "'");
  return it->second;
}

std::string UcxTransportImpl::peer_name(PeerId peer) const {
  std::lock_guard<std::mutex> lk(peers_mu_);
  return peer < n_peers_ ? peers_[peer].name : "?";
}

bool UcxTransportImpl::is_connected(PeerId peer) const {
  std::lock_guard<std::mutex> lk(peers_mu_);
  return peer < n_peers_ && peers_[peer].connected;
}

void UcxTransportImpl::push_event(PeerEvent ev) { events_.push(std::move(ev)); }

bool UcxTransportImpl::next_event(PeerEvent* ev, int64_t deadline_ns) { return events_.pop(ev, deadline_ns); }

void UcxTransportImpl::wake() {
  if (sleeping_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    ssize_t r = ::write(wake_fd_, &one, sizeof one);
    (void)r;
  }
}

Status UcxTransportImpl::post_error(uint64_t tag, PeerId peer) const {
  if ((tag & ~kTagMask) != 0) return invalid_argument("transport tag uses more than 48 bits");
  return invalid_argument("ucx transport: unknown peer " + std::to_string(peer));
}

Result<RequestId> UcxTransportImpl::enqueue(Command::Kind kind, PeerId peer, uint64_t tag, void* buf, size_t len,
                                            CompletionFn&& on_done) {
  if ((tag & ~kTagMask) != 0 || peer >= n_peers_.load(std::memory_order_acquire)) return post_error(tag, peer);
  // Direct path: when nobody is progressing, post on the caller's thread (after whatever
  // is queued, to keep per-tag order) and push it out with one progress call.
  if (try_lock_worker()) {
    if (worker_ != nullptr && !stop_.load()) {
      if (n_cmds_.load(std::memory_order_acquire) > 0) progress_once(0, true);
      if (kind == Command::send && len <= kImmediateMaxBytes && send_now(peer, tag, buf, len)) {
        if (n_deferred_ > 0) post_deferred();  // the send is out: now the receives before it
        unlock_worker();
        if (on_done) on_done(Completion{Status::ok(), len});  // after unlocking: it may post
        return RequestTable::finished_id(len);
      }
      Result<RequestId> allocated = table_.allocate(std::move(on_done));
      if (!allocated.ok()) {
        unlock_worker();
        return allocated.status();
      }
      RequestId id = *allocated;
      if (kind == Command::send) {
        do_send(id, peer, tag, buf, len);
        if (n_deferred_ > 0) post_deferred();
      } else if (!defer_recv(id, peer, tag, buf, len)) {
        do_recv(id, peer, tag, buf, len);
      }
      // One progress call moves a send that stayed in flight (rendezvous) along. An
      // eager send completed inside the post, and a receive is matched by whoever
      // progresses next (a waiter, or the progress thread): no idle call for them.
      if (kind == Command::send && n_live_.load(std::memory_order_relaxed) > 0 && table_.is_pending(id)) {
        ucp_worker_progress(worker_);
      }
      unlock_worker();
      // No wake here: measured, waking the progress thread on every post that stays in
      // flight (a receive, a rendezvous send) made the 64 KiB ping-pong 5x slower on two
      // vCPUs; a running progress thread picks it up, an idle one is woken by the worker's
      // events, a parked one within kParkTimeoutUs: handoff_ (a plain store) makes it run at
      // its next look even if a short wait moved the epoch meanwhile (should_park).
      handoff_.store(true, std::memory_order_relaxed);
      return id;
    }
    unlock_worker();
  }
  return enqueue_command(kind, peer, tag, buf, len, std::move(on_done));
}

Result<RequestId> UcxTransportImpl::enqueue_command(Command::Kind kind, PeerId peer, uint64_t tag, void* buf, size_t len,
                                                    CompletionFn&& on_done) {
  AFD_ASSIGN_OR_RETURN(RequestId id, table_.allocate(std::move(on_done)));
  Command c;
  c.kind = kind;
  c.id = id;
  c.peer = peer;
  c.tag = tag;
  c.buf = buf;
  c.len = len;
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    if (stop_.load()) {
      table_.complete_exclusive(id, Completion{cancelled("ucx transport '" + opt_.name + "' is closed"), 0});
      return id;
    }
    cmds_.push_back(std::move(c));
    n_cmds_.fetch_add(1, std::memory_order_seq_cst);
  }
  wake();
  return id;
}

Result<RequestId> UcxTransportImpl::post_send(PeerId peer, uint64_t tag, const void* data, size_t len,
                                              CompletionFn on_done) {
  return enqueue(Command::send, peer, tag, const_cast<void*>(data), len, std::move(on_done));
}

Result<RequestId> UcxTransportImpl::post_recv(PeerId peer, uint64_t tag, void* buf, size_t capacity,
                                              CompletionFn on_done) {
  return enqueue(Command::recv, peer, tag, buf, capacity, std::move(on_done));
}

void UcxTransportImpl::cancel(RequestId id) {
  std::lock_guard<std::mutex> lk(cmd_mu_);
  if (stop_.load()) return;
  Command c;
  c.kind = Command::cancel;
  c.id = id;
  cmds_.push_back(std::move(c));
  n_cmds_.fetch_add(1);
  wake();
}

Status UcxTransportImpl::disconnect(PeerId peer) {
  std::lock_guard<std::mutex> lk(cmd_mu_);
  if (stop_.load()) return unavailable("ucx transport closed");
  Command c;
  c.kind = Command::drop_peer;
  c.peer = peer;
  c.detail = "disconnected on request";
  cmds_.push_back(std::move(c));
  n_cmds_.fetch_add(1);
  wake();
  return Status::ok();
}

Result<MemoryRegion> UcxTransportImpl::register_memory(void* base, size_t size) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = base;
  p.length = size;
  ucp_mem_h memh = nullptr;
  WorkerGuard g(*this);
  ucs_status_t st = ucp_mem_map(context_, &p, &memh);
  if (st != UCS_OK) return resource_exhausted(ucs_error("ucp_mem_map", st) + " (" + std::to_string(size) + " bytes)");
  MemoryRegion r{base, size, reinterpret_cast<uint64_t>(memh)};
  auto at = std::upper_bound(regions_.begin(), regions_.end(), base,
                             [](void* b, const Region& x) { return std::less<void*>()(b, x.r.base); });
  regions_.insert(at, Region{r, memh});
  max_region_size_ = std::max(max_region_size_, size);
  return r;
}

Status UcxTransportImpl::deregister_memory(const MemoryRegion& region) {
  WorkerGuard g(*this);
  for (auto it = regions_.begin(); it != regions_.end(); ++it) {
    if (it->r.base == region.base && it->r.handle == region.handle) {
      ucp_mem_unmap(context_, it->memh);
      regions_.erase(it);
      return Status::ok();
    }
  }
  return not_found("ucx deregister_memory: region was not registered here");
}

void UcxTransportImpl::add_memh(ucp_request_param_t* param, const void* buf, size_t len) {
  if (len < kMemhMinBytes) return;
  if (ucp_mem_h memh = find_memh(buf, len)) {
    param->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param->memh = memh;
  }
}

ucp_mem_h UcxTransportImpl::find_memh(const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p);
  // Regions with base <= a, nearest first; one that starts more than max_region_size_
  // below a cannot contain it, nor can any before it.
  auto it = std::upper_bound(regions_.begin(), regions_.end(), a, [](uintptr_t x, const Region& r) {
    return x < reinterpret_cast<uintptr_t>(r.r.base);
  });
  while (it != regions_.begin()) {
    --it;
    auto b = reinterpret_cast<uintptr_t>(it->r.base);
    if (a - b > max_region_size_) break;
    if (a + n <= b + it->r.size) return it->memh;
  }
  return nullptr;
}

// ---------------- progress thread ----------------

OpCtx* UcxTransportImpl::take_ctx(RequestId id, PeerId peer) {
  OpCtx* ctx;
  if (ctx_pool_.empty()) {
    ctx = new OpCtx;
  } else {
    ctx = ctx_pool_.back();
    ctx_pool_.pop_back();
    // Field by field, not `*ctx = OpCtx{}`: that built a zeroed temporary (rep stos) and
    // copied it back through a store-forwarding stall, ~a third of this call (perf).
    ctx->req = nullptr;
    ctx->lost = false;
    ctx->in_post = true;
    ctx->done = false;
    ctx->live_prev = ctx->live_next = nullptr;
  }
  ctx->self = this;
  ctx->id = id;
  ctx->peer = peer;
  return ctx;
}

void UcxTransportImpl::give_ctx(OpCtx* ctx) { ctx_pool_.push_back(ctx); }

void UcxTransportImpl::add_live(OpCtx* ctx) {
  live_[RequestTable::slot_of(ctx->id)] = ctx;  // a pending request's slot is not reused, so it is free here
  ctx->live_prev = nullptr;
  ctx->live_next = live_head_;
  if (live_head_ != nullptr) live_head_->live_prev = ctx;
  live_head_ = ctx;
  n_live_.store(n_live_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void UcxTransportImpl::remove_live(OpCtx* ctx) {
  live_[RequestTable::slot_of(ctx->id)] = nullptr;
  if (ctx->live_prev != nullptr) ctx->live_prev->live_next = ctx->live_next;
  else live_head_ = ctx->live_next;
  if (ctx->live_next != nullptr) ctx->live_next->live_prev = ctx->live_prev;
  n_live_.store(n_live_.load(std::memory_order_relaxed) - 1, std::memory_order_release);
}

OpCtx* UcxTransportImpl::find_live(RequestId id) const {
  uint32_t slot = RequestTable::slot_of(id);
  if (slot >= kMaxInFlight) return nullptr;
  OpCtx* ctx = live_[slot];
  return ctx != nullptr && ctx->id == id ? ctx : nullptr;  // the same slot under another generation is not it
}

void* UcxTransportImpl::live_request(RequestId id) const {
  const uint32_t slot = RequestTable::slot_of(id);
  if (slot >= kMaxInFlight) return nullptr;
  const RecvOp& r = recv_ops_[slot];
  if (r.state == RecvOp::kLive && r.id == id) return r.req;
  OpCtx* ctx = find_live(id);
  return ctx != nullptr ? ctx->req : nullptr;
}

std::vector<RequestId> UcxTransportImpl::live_recvs(PeerId peer, bool mark_lost) {
  std::vector<RequestId> ids;
  for (uint32_t i = 0; i < kMaxInFlight; ++i) {
    RecvOp& r = recv_ops_[i];
    if (r.state != RecvOp::kLive || (peer != kNoPeer && r.peer != peer)) continue;
    if (mark_lost) r.lost = true;
    ids.push_back(r.id);
  }
  return ids;
}

void UcxTransportImpl::finish(OpCtx* ctx, Completion c) {
  // ctx is settled before the request completes: a completion callback, or a waiter
  // reusing the slot, then never meets it.
  RequestId id = ctx->id;
  if (ctx->in_post) {
    ctx->done = true;  // the poster returns it to the pool when the post call returns
  } else {
    remove_live(ctx);
    give_ctx(ctx);
  }
  table_.complete_exclusive(id, std::move(c));
}

void UcxTransportImpl::send_cb(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<OpCtx*>(user_data);
  UcxTransportImpl* self = ctx->self;
  Completion c;
  if (status == UCS_OK) {
    c = Completion{Status::ok(), 0};
  } else if (ctx->lost) {
    c = Completion{unavailable(self->peers_[ctx->peer].lost_why), 0};
  } else if (status == UCS_ERR_CANCELED) {
    c = Completion{cancelled("send cancelled"), 0};
  } else {
    c = Completion{unavailable(ucs_error("send to peer failed", status)), 0};
  }
  ucp_request_free(request);
  self->finish(ctx, std::move(c));
}

Completion UcxTransportImpl::recv_failure(const RecvOp& r, ucs_status_t status) const {
  if (r.lost) return Completion{unavailable(peers_[r.peer].lost_why), 0};
  if (status == UCS_ERR_CANCELED) return Completion{cancelled("receive cancelled"), 0};
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    return Completion{resource_exhausted("message exceeds the posted receive buffer"), 0};
  }
  return Completion{unavailable(ucs_error("receive failed", status)), 0};
}

void UcxTransportImpl::recv_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* r = static_cast<RecvOp*>(user_data);
  UcxTransportImpl* self = r->self;
  Completion c = status == UCS_OK ? Completion{Status::ok(), info ? info->length : 0} : self->recv_failure(*r, status);
  ucp_request_free(request);
  // The entry is settled before the request completes (a waiter may reuse the slot).
  if (r->state == RecvOp::kPosting) {
    r->state = RecvOp::kDoneInPost;  // the poster sees it when the post call returns
  } else {
    r->state = RecvOp::kIdle;
    r->req = nullptr;
    self->n_live_.store(self->n_live_.load(std::memory_order_relaxed) - 1, std::memory_order_release);
  }
  self->table_.complete_exclusive(r->id, std::move(c));
}

void UcxTransportImpl::err_cb(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* a = static_cast<ErrArg*>(arg);
  // Deferred: endpoints are closed outside ucp_worker_progress.
  a->self->failed_eps_.emplace_back(a->peer, a->gen);
  spdlog::debug("ucx: endpoint error for peer {}: {}", a->peer, ucs_status_string(status));
}

void UcxTransportImpl::do_send(RequestId id, PeerId peer, uint64_t user_tag, void* buf, size_t len) {
  Peer& p = peers_[peer];
  if (p.ep == nullptr) {
    table_.complete_exclusive(id, Completion{unavailable("peer '" + peer_name(peer) + "' is not connected"), 0});
    return;
  }
  OpCtx* ctx = take_ctx(id, peer);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransportImpl::send_cb;
  param.user_data = ctx;
  add_memh(&param, buf, len);
  uint64_t tag = wire_tag(p.src_id_there, user_tag);
  ucs_status_ptr_t st = ucp_tag_send_nbx(p.ep, buf, len, tag, &param);
  if (st == nullptr) {
    give_ctx(ctx);
    table_.complete_exclusive(id, Completion{Status::ok(), len});
  } else if (UCS_PTR_IS_ERR(st)) {
    give_ctx(ctx);
    table_.complete_exclusive(id, Completion{unavailable(ucs_error("ucp_tag_send_nbx", UCS_PTR_STATUS(st))), 0});
  } else if (ctx->done) {
    give_ctx(ctx);  // completed inside the call
  } else {
    ctx->in_post = false;
    ctx->req = st;
    add_live(ctx);
  }
}

bool UcxTransportImpl::send_now(PeerId peer, uint64_t user_tag, const void* buf, size_t len) {
  Peer& p = peers_[peer];
  if (p.ep == nullptr) return false;
  ucp_request_param_t param;  // UCX reads only the fields op_attr_mask selects (none here)
  param.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  uint64_t tag = wire_tag(p.src_id_there, user_tag);
  ucs_status_ptr_t st = ucp_tag_send_nbx(p.ep, buf, len, tag, &param);
  if (st == nullptr) return true;
  if (UCS_PTR_IS_ERR(st)) return false;  // NO_RESOURCE (nothing was sent), or an error
  // UCX documents FORCE_IMM_CMPL as never returning a request; should one come back
  // anyway, the send is under way: finish it here so the caller's buffer is free.
  while (ucp_request_check_status(st) == UCS_INPROGRESS) ucp_worker_progress(worker_);
  ucp_request_free(st);
  return true;
}

void UcxTransportImpl::do_recv(RequestId id, PeerId peer, uint64_t user_tag, void* buf, size_t len) {
  if (peers_[peer].ep == nullptr) {
    table_.complete_exclusive(id, Completion{unavailable("peer '" + peer_name(peer) + "' is not connected"), 0});
    return;
  }
  RecvOp& r = recv_ops_[RequestTable::slot_of(id)];
  r.id = id;
  r.peer = peer;
  r.lost = false;
  start_recv(r, buf, len, user_tag, /*counted=*/false);
}

bool UcxTransportImpl::defer_recv(RequestId id, PeerId peer, uint64_t user_tag, void* buf, size_t len) {
  if (peers_[peer].ep == nullptr) return false;
  if (n_deferred_ == kMaxDeferred) post_deferred();  // (in order: the older ones first)
  const uint32_t slot = RequestTable::slot_of(id);
  RecvOp& r = recv_ops_[slot];
  r.id = id;
  r.peer = peer;
  r.lost = false;
  r.state = RecvOp::kDeferred;
  r.buf = buf;
  r.len = len;
  r.user_tag = user_tag;
  deferred_[n_deferred_++] = slot;
  n_live_.store(n_live_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  return true;
}

void UcxTransportImpl::post_deferred() {
  // Emptied first: a completion inside a post may run a callback that posts again (through
  // the command queue, as this thread holds the worker), never into this list.
  const uint32_t n = n_deferred_;
  n_deferred_ = 0;
  for (uint32_t i = 0; i < n; ++i) {
    RecvOp& r = recv_ops_[deferred_[i]];
    // The endpoint is the one the receive was deferred under: a loss posts the deferred
    // receives before it closes an endpoint, and a new one comes only from a command,
    // which runs after them.
    start_recv(r, r.buf, r.len, r.user_tag, /*counted=*/true);
  }
}

void UcxTransportImpl::start_recv(RecvOp& r, void* buf, size_t len, uint64_t user_tag, bool counted) {
  const RequestId id = r.id;
  r.state = RecvOp::kPosting;
  ucp_request_param_t param;  // UCX reads only the fields op_attr_mask selects
  // UCX 1.13 leaves recv_info.tag_info unfilled on immediate completion of an unexpected
  // eager message (measured: length 0), so completions always go through the callback.
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = &UcxTransportImpl::recv_cb;
  param.user_data = &r;
  add_memh(&param, buf, len);
  uint64_t tag = wire_tag(peers_[r.peer].recv_src, user_tag);
  ucs_status_ptr_t st = ucp_tag_recv_nbx(worker_, buf, len, tag, ~uint64_t{0}, &param);
  bool live = false;
  if (r.state == RecvOp::kDoneInPost) {
    r.state = RecvOp::kIdle;  // completed inside the call
  } else if (st == nullptr) {
    // Not expected with NO_IMM_CMPL: an immediate completion, whose length UCX would not
    // have reported (see above).
    r.state = RecvOp::kIdle;
    table_.complete_exclusive(id, Completion{internal_error("ucp_tag_recv_nbx completed at once despite NO_IMM_CMPL"), 0});
  } else if (UCS_PTR_IS_ERR(st)) {
    r.state = RecvOp::kIdle;
    ucs_status_t e = UCS_PTR_STATUS(st);
    Status why = e == UCS_ERR_MESSAGE_TRUNCATED ? resource_exhausted("message exceeds the posted receive buffer")
                                                : unavailable(ucs_error("ucp_tag_recv_nbx", e));
    table_.complete_exclusive(id, Completion{why, 0});
  } else {
    r.req = st;
    r.state = RecvOp::kLive;
    live = true;
  }
  if (live != counted) {
    n_live_.store(n_live_.load(std::memory_order_relaxed) + (live ? 1 : -1), std::memory_order_release);
  }
}

void UcxTransportImpl::discard_unexpected(uint16_t src, const std::string& name) {
  const uint64_t tag = wire_tag(src, 0), mask = ~kTagMask;
  size_t n = 0;
  for (;;) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, tag, mask, 1, &info);
    if (msg == nullptr) break;
    ++n;
    // Received into a scratch buffer that the completion frees (a rendezvous one from a
    // dead peer ends with an error, later or never: nothing waits for it).
    auto* sink = new std::vector<uint8_t>(std::max<size_t>(info.length, 1));
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.recv = [](void* request, ucs_status_t, const ucp_tag_recv_info_t*, void* user) {
      delete static_cast<std::vector<uint8_t>*>(user);
      ucp_request_free(request);
    };
    prm.user_data = sink;
    ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker_, sink->data(), info.length, msg, &prm);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) delete sink;  // done inside the call, or failed: no callback
  }
  if (n > 0) spdlog::info("ucx: {} dropped {} unreceived message(s) of a lost connection from {}", opt_.name, n, name);
}

void UcxTransportImpl::add_peer(Command& c) {
  Peer& p = peers_[c.peer];
  if (p.ep != nullptr || p.fd >= 0) lose_peer(c.peer, p.gen, "replaced by a new connection from the same peer");
  auto arg = std::make_unique<ErrArg>(ErrArg{this, c.peer, p.gen + 1});
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(c.addr.data());
  ep.err_mode = opt_.peer_error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep.err_handler.cb = &UcxTransportImpl::err_cb;
  ep.err_handler.arg = arg.get();
  ucp_ep_h h = nullptr;
  ucs_status_t st = ucp_ep_create(worker_, &ep, &h);
  std::string name = peer_name(c.peer);
  if (st != UCS_OK) {
    spdlog::error("ucx: {} cannot create an endpoint to {}: {}", opt_.name, name, ucs_status_string(st));
    close_fd(c.fd);
    return;
  }
  p.gen += 1;
  err_args_.push_back(std::move(arg));
  p.ep = h;
  p.fd = c.fd;
  p.src_id_there = c.src_id_there;
  // Late arrivals of the previous connection (lose_peer dropped what had come by then).
  if (p.recv_src != 0 && p.recv_src != c.recv_src) discard_unexpected(p.recv_src, name);
  p.recv_src = c.recv_src;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = c.fd;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, c.fd, &ev);
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    p.connected = true;
  }
  spdlog::info("ucx: {} connected to {} ({})", opt_.name, name, c.detail);
  push_event(PeerEvent{PeerEventKind::connected, c.peer, name, c.detail});
}

void UcxTransportImpl::lose_peer(PeerId pid, uint64_t gen, const std::string& why) {
  // Deferred receives go to UCX under the connection they were made for, so the loss
  // below cancels this peer's like any live one.
  if (n_deferred_ > 0) post_deferred();
  Peer& p = peers_[pid];
  if (p.gen != gen || (p.ep == nullptr && p.fd < 0)) return;
  std::string name = peer_name(pid);
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    p.connected = false;
  }
  if (p.fd >= 0) {
    epoll_ctl(epfd_, EPOLL_CTL_DEL, p.fd, nullptr);
    close_fd(p.fd);
    p.fd = -1;
  }
  std::string msg = "peer '" + name + "' disconnected: " + why;
  // Its sends fail on their own as the endpoint closes (with msg); its receives (matched
  // worker-wide, not by endpoint) are cancelled. ucp_request_cancel may run the completion
  // callback synchronously: collect first, cancel after.
  for (OpCtx* ctx = live_head_; ctx != nullptr; ctx = ctx->live_next) {
    if (ctx->peer != pid) continue;
    ctx->lost = true;
  }
  p.lost_why = msg;
  cancel_live(live_recvs(pid, /*mark_lost=*/true));
  if (p.ep != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(p.ep, &param);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
    p.ep = nullptr;
  }
  if (p.recv_src != 0) discard_unexpected(p.recv_src, name);
  if (stop_.load()) {
    spdlog::info("ucx: {} lost {}", opt_.name, msg);  // this transport is closing: expected
  } else {
    spdlog::warn("ucx: {} lost {}", opt_.name, msg);
  }
  push_event(PeerEvent{PeerEventKind::disconnected, pid, name, why});
}

void UcxTransportImpl::check_liveness() {
  std::vector<pollfd> fds;
  std::vector<PeerId> who;
  PeerId n;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    n = n_peers_;
  }
  for (PeerId i = 0; i < n; ++i) {
    if (peers_[i].fd >= 0) {
      fds.push_back(pollfd{peers_[i].fd, POLLIN | POLLRDHUP, 0});
      who.push_back(i);
    }
  }
  if (fds.empty()) return;
  if (::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (size_t k = 0; k < fds.size(); ++k) {
    if (fds[k].revents == 0) continue;
    char buf[64];
    ssize_t r = ::recv(fds[k].fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) || (fds[k].revents & (POLLERR | POLLHUP | POLLRDHUP))) {
      lose_peer(who[k], peers_[who[k]].gen, r == 0 ? "connection closed" : "connection error");
    }
  }
}

void UcxTransportImpl::cancel_live(const std::vector<RequestId>& ids) {
  // Looked up one by one: a cancel may complete (and free) other requests synchronously.
  for (RequestId id : ids) {
    if (void* req = live_request(id)) ucp_request_cancel(worker_, req);
  }
}

void UcxTransportImpl::handle(Command& c) {
  switch (c.kind) {
    case Command::send: do_send(c.id, c.peer, c.tag, c.buf, c.len); break;
    case Command::recv: do_recv(c.id, c.peer, c.tag, c.buf, c.len); break;
    case Command::add_peer: add_peer(c); break;
    case Command::drop_peer: lose_peer(c.peer, peers_[c.peer].gen, c.detail); break;
    case Command::cancel:
      if (void* req = live_request(c.id)) ucp_request_cancel(worker_, req);
      break;
  }
}

bool UcxTransportImpl::progress_once(int64_t now, bool drain) {
  bool active = false;
  if (n_deferred_ > 0) post_deferred();  // before the commands queued after them
  if (n_cmds_.load(std::memory_order_acquire) > 0) {
    std::vector<Command> batch;
    {
      std::lock_guard<std::mutex> lk(cmd_mu_);
      batch.swap(cmds_);
      n_cmds_.store(0, std::memory_order_release);
    }
    for (auto& c : batch) handle(c);
    active = true;
  }
  if (drain) {
    while (ucp_worker_progress(worker_) != 0) active = true;
  } else if (ucp_worker_progress(worker_) != 0) {
    active = true;
  }
  if (!failed_eps_.empty()) {
    auto failed = std::move(failed_eps_);
    failed_eps_.clear();
    for (auto& [p, g] : failed) lose_peer(p, g, "UCX endpoint error");
  }
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(*it) != UCS_INPROGRESS) {
      ucp_request_free(*it);
      it = closing_.erase(it);
    } else {
      ++it;
    }
  }
  if (now != 0 && now >= next_liveness_.load(std::memory_order_relaxed)) {
    check_liveness();
    next_liveness_.store(now + 1000000, std::memory_order_relaxed);
  }
  return active;
}

void UcxTransportImpl::lock_worker() {
  if (try_lock_worker()) return;
  // Tell a waiter that keeps the lock across its polling turns to let go (wait_any).
  lock_wanted_.fetch_add(1, std::memory_order_relaxed);
  for (uint32_t n = 0; !try_lock_worker(); ++n) {
    if (n < 64) {
      cpu_relax();
    } else if (n < 1024) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  lock_wanted_.fetch_sub(1, std::memory_order_relaxed);
}

int UcxTransportImpl::wait_any(std::span<const RequestId> ids, int64_t deadline_ns) {
  int r = table_.poll_any(ids);
  if (r >= 0) return r;
  // A caller with nothing else to do drives the worker itself for up to waiter_spin_ns,
  // as ucx_perftest does (no thread hand-off on the latency path). Meanwhile the progress
  // thread stays parked off the CPU (it never contends for the worker while waiters_ > 0):
  // on a machine with fewer free cores than spinning threads, a second spinner per
  // process starved the peer process (docs/BENCHMARKS.md "Communication").
  //
  // The clock is read every kClockEvery turns only (a clock read costs about as much as an
  // idle progress call here): the deadline and the spin limit are overshot by at most that
  // many turns, and the liveness sockets are checked at the first clock reading past due.
  constexpr uint32_t kClockEvery = 16;
  // Turns in a row that find the worker held by another thread before this waiter yields
  // its core instead of pausing (a pass over the worker takes well under a microsecond).
  constexpr uint32_t kHeldSpins = 64;
  // Past this much waiting, the waiter also yields its core at every clock reading (about
  // once a microsecond). Measured on two vCPUs: a waiter that never yields keeps a thread
  // woken on its core (the peer process's caller, woken from its condition variable) off
  // the CPU until the spin limit, and both processes then settled into a state where every
  // wait ran out its spin (520 KiB ping-pong: 230 us per message instead of 45, in 4 of 10
  // runs). Short waits, which complete well within this, never pay for a yield.
  constexpr int64_t kYieldAfterNs = 20000;
  uint32_t held_turns = 0;
  // The worker lock is kept from one turn to the next while nobody else asks for it
  // (lock_wanted_) and this waiter does not yield: taking it is a locked exchange, which
  // drains the store buffer; once per turn it was two thirds of an idle turn (perf), and a
  // longer turn is a later look at an arriving message. Posts from other threads meanwhile
  // go through the command queue, which the next turn runs.
  bool held = false;
  // Registered in waiters_ from the first clock reading on (see waiters_).
  bool registered = false;
  // The spin limit counts from the first clock reading (kClockEvery turns in), so a wait
  // that completes within those turns reads no clock at all.
  int64_t spin_until = std::numeric_limits<int64_t>::max();
  int64_t yield_from = std::numeric_limits<int64_t>::max();
  for (uint32_t turn = 1;; ++turn) {
    int64_t t = turn % kClockEvery == 0 ? now_ns() : 0;
    if (turn == kClockEvery) {
      spin_until = t + opt_.waiter_spin_ns;
      yield_from = t + kYieldAfterNs;
      waiters_.fetch_add(1, std::memory_order_seq_cst);
      registered = true;
    }
    // No pause after a progress call of our own: that call is the polling, as in
    // ucx_perftest, and a pause (~140 cycles here, half of a turn; perf) delayed noticing
    // an arrival by that much. Only while another thread holds the worker.
    if (!held && (held = try_lock_worker())) {
      waiter_epoch_.store(waiter_epoch_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
    if (held) {
      // Most turns have nothing but the worker to look at: call UCX directly then (the
      // full pass has a large frame and several checks, ~a third of an idle turn; perf).
      if (n_deferred_ > 0) post_deferred();  // (not through progress_once: its frame costs ~70 instructions)
      if (t == 0 && n_cmds_.load(std::memory_order_acquire) == 0 && failed_eps_.empty() && closing_.empty()) {
        ucp_worker_progress(worker_);
      } else {
        progress_once(t, false);
      }
    }
    r = table_.poll_any(ids);
    if (r >= 0) break;
    if (t != 0 && (t >= deadline_ns || t >= spin_until)) break;
    if (stop_.load(std::memory_order_relaxed)) break;
    held_turns = held ? 0 : held_turns + 1;
    // Past kYieldAfterNs; or another thread has held the worker for a while: it may be
    // preempted while holding it (more runnable threads than cores), and spinning here
    // keeps it off the CPU.
    bool yield = t >= yield_from || held_turns >= kHeldSpins;
    if (held && (yield || lock_wanted_.load(std::memory_order_relaxed) > 0)) {
      unlock_worker();
      held = false;
    }
    if (yield) {
      std::this_thread::yield();
    } else if (!held) {
      cpu_relax();
    }
  }
  if (held) unlock_worker();
  // Hand progress back when this caller gives up, or when operations it does not wait
  // for are still in flight (they must move while the caller computes). Dekker with park():
  // handoff_ is raised before sleeping_ is read (the fetch_sub or the fence orders them).
  bool last = !registered || waiters_.fetch_sub(1, std::memory_order_seq_cst) == 1;
  if (last && (r < 0 || n_live_.load(std::memory_order_acquire) > 0 || n_cmds_.load(std::memory_order_acquire) > 0)) {
    handoff_.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    wake();
  }
  if (r >= 0) return r;
  return table_.wait_any(ids, deadline_ns);
}

Completion UcxTransportImpl::wait(RequestId id, int64_t deadline_ns) {
  // A finished id (a small send, typically) reads as done at once; any other id is looked
  // at first by wait_any's own poll, so a receive is tested once, when it is done.
  if (!RequestTable::is_finished_id(id)) {
    RequestId one[1] = {id};
    if (wait_any(one, deadline_ns) < 0) {
      return Completion{timeout_error("transport: operation did not finish before its deadline"), 0};
    }
  }
  Completion c;
  table_.test(id, &c);
  return c;
}

void UcxTransportImpl::park(bool behind_driver) {
  // Sleeps on the wake fd only (not the worker's event fd: the waiter handles those
  // events). Dekker with wait_any's exit: either it sees sleeping_ and writes the fd, or
  // this thread sees handoff_ (behind a driver: the worker unlocked, which that exit does
  // first) and does not sleep; with enqueue likewise for a command queued while no
  // registered waiter is there to run it.
  sleeping_.store(true, std::memory_order_seq_cst);
  const bool sleep = behind_driver ? worker_locked_.load(std::memory_order_seq_cst)
                                   : !handoff_.load(std::memory_order_seq_cst) &&
                                         (waiters_.load(std::memory_order_seq_cst) > 0 ||
                                          n_cmds_.load(std::memory_order_seq_cst) == 0);
  if (sleep && !stop_.load()) {
    pollfd p{wake_fd_, POLLIN, 0};
    timespec ts{0, kParkTimeoutUs * 1000};
    if (::ppoll(&p, 1, &ts, nullptr) > 0) {
      uint64_t v;
      ssize_t n = ::read(wake_fd_, &v, sizeof v);
      (void)n;
    }
  }
  sleeping_.store(false, std::memory_order_seq_cst);
}

bool UcxTransportImpl::should_park() {
  if (handoff_.load(std::memory_order_acquire)) {
    handoff_.store(false, std::memory_order_relaxed);
    return false;  // a waiter left work in flight: drive it
  }
  if (waiters_.load(std::memory_order_seq_cst) > 0) return true;
  if (n_cmds_.load(std::memory_order_acquire) > 0) return false;  // nobody registered to run them
  uint64_t e = waiter_epoch_.load(std::memory_order_relaxed);
  if (e == seen_epoch_) return false;
  seen_epoch_ = e;  // a short wait took the worker since the last look: stay parked a period
  return true;
}

void UcxTransportImpl::progress_loop() {
  int64_t last_active = now_ns();
  while (!stop_.load(std::memory_order_relaxed)) {
    if (should_park()) {
      park();
      last_active = now_ns();
      continue;
    }
    // A caller holding the worker is driving it: a waiter keeps it across its polling
    // turns and runs the queued commands, the failed endpoints and the liveness checks
    // itself. So this thread does not queue for it (lock_worker raises lock_wanted_,
    // which makes that waiter let go, pause and take the lock again on every turn until
    // this thread, which shares a core with it when cores are few, gets in: measured, a
    // 64 B ping-pong on two vCPUs spent a third of its waiting turns so). It waits out a
    // short holder (a post) and otherwise sleeps while the worker stays held, the handoff
    // kept raised for its next look.
    if (!try_lock_worker()) {
      for (int i = 0; i < 16 && worker_locked_.load(std::memory_order_relaxed); ++i) cpu_relax();
      if (!try_lock_worker()) {
        handoff_.store(true, std::memory_order_relaxed);
        park(/*behind_driver=*/true);
        continue;
      }
    }
    bool active = progress_once(now_ns(), true);
    unlock_worker();
    int64_t t = now_ns();
    if (active) {
      last_active = t;
      continue;
    }
    if (t - last_active < opt_.progress_spin_ns) {
      // Polling, but never hold a core another runnable thread (the caller waiting on a
      // completion, typically) needs: without this a spinning progress thread costs a
      // whole scheduler time slice (~5 ms measured) per message on a busy machine.
      std::this_thread::yield();
      continue;
    }
    // Idle: sleep on the worker's event fd, the wake fd and the liveness sockets.
    lock_worker();
    ucs_status_t armed = ucp_worker_arm(worker_);
    unlock_worker();
    if (armed == UCS_ERR_BUSY) continue;
    sleeping_.store(true, std::memory_order_seq_cst);
    if (n_cmds_.load(std::memory_order_seq_cst) == 0 && !stop_.load()) {
      epoll_event evs[16];
      int n = epoll_wait(epfd_, evs, 16, 50);
      for (int i = 0; i < n; ++i) {
        if (evs[i].data.fd == wake_fd_) {
          uint64_t v;
          ssize_t r = ::read(wake_fd_, &v, sizeof v);
          (void)r;
        } else if (evs[i].data.fd != worker_efd_) {
          next_liveness_ = 0;
        }
      }
    }
    sleeping_.store(false, std::memory_order_seq_cst);
    last_active = now_ns() - opt_.progress_spin_ns + 200000;  // spin briefly after waking
  }
  lock_worker();
  // Shutting down: fail queued commands, cancel what is in flight (deferred receives
  // posted first, so they are), close endpoints.
  if (n_deferred_ > 0) post_deferred();
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    for (auto& c : cmds_) {
      if (c.kind == Command::send || c.kind == Command::recv) {
        table_.complete_exclusive(c.id, Completion{cancelled("ucx transport closed"), 0});
      }
      if (c.kind == Command::add_peer) close_fd(c.fd);
    }
    cmds_.clear();
  }
  PeerId n;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    n = n_peers_;
  }
  for (PeerId i = 0; i < n; ++i) lose_peer(i, peers_[i].gen, "transport closed");
  {
    std::vector<RequestId> to_cancel = live_recvs(kNoPeer, /*mark_lost=*/false);
    for (OpCtx* ctx = live_head_; ctx != nullptr; ctx = ctx->live_next) to_cancel.push_back(ctx->id);
    cancel_live(to_cancel);
  }
  int64_t deadline = now_ns() + 2000000000;
  while ((n_live_.load(std::memory_order_relaxed) > 0 || !closing_.empty()) && now_ns() < deadline) {
    ucp_worker_progress(worker_);
    for (auto it = closing_.begin(); it != closing_.end();) {
      if (ucp_request_check_status(*it) != UCS_INPROGRESS) {
        ucp_request_free(*it);
        it = closing_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // The UCX requests still live are abandoned with their worker; their ctx leak
  // intentionally (the worker may still reference them).
  std::vector<RequestId> abandoned = live_recvs(kNoPeer, /*mark_lost=*/false);
  for (RequestId id : abandoned) recv_ops_[RequestTable::slot_of(id)].state = RecvOp::kIdle;
  for (OpCtx* ctx = live_head_; ctx != nullptr; ctx = ctx->live_next) {
    live_[RequestTable::slot_of(ctx->id)] = nullptr;
    abandoned.push_back(ctx->id);
  }
  live_head_ = nullptr;
  n_live_.store(0, std::memory_order_release);
  for (RequestId id : abandoned) table_.complete_exclusive(id, Completion{cancelled("ucx transport closed"), 0});
  unlock_worker();
}

// ---------------- bootstrap thread ----------------

Status UcxTransportImpl::exchange(int fd, const std::string& dialed, PeerId* out_peer) {
  int64_t deadline = now_ns() + int64_t{opt_.bootstrap_timeout_ms} * 1000000;
  // Round 1: {magic, version, name_len, addr_len, name, addr} both ways.
  uint8_t hdr[12];
  uint32_t magic = kBootMagic;
  uint16_t ver = kBootVersion, name_len = static_cast<uint16_t>(opt_.name.size());
  uint32_t addr_len = static_cast<uint32_t>(worker_address_.size());
  std::memcpy(hdr, &magic, 4);
  std::memcpy(hdr + 4, &ver, 2);
  std::memcpy(hdr + 6, &name_len, 2);
  std::memcpy(hdr + 8, &addr_len, 4);
  AFD_RETURN_IF_ERROR(send_all(fd, hdr, sizeof hdr, deadline));
  AFD_RETURN_IF_ERROR(send_all(fd, opt_.name.data(), opt_.name.size(), deadline));
  AFD_RETURN_IF_ERROR(send_all(fd, worker_address_.data(), worker_address_.size(), deadline));
  uint8_t rh[12];
  // A listener that is not an afd transport (an HTTP server, say) may accept and then say
  // nothing: say so rather than only "timed out".
  if (Status st = recv_all(fd, rh, sizeof rh, deadline); !st.is_ok()) {
    return st.code() == StatusCode::timeout
               ? timeout_error("no afd handshake from " + (dialed.empty() ? std::string("the peer") : dialed) +
                               " within " + std::to_string(opt_.bootstrap_timeout_ms) +
                               " ms (is an afd worker listening there?)")
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
  if (r_addr_len == 0 || r_addr_len > (1u << 20)) return corrupt_data("bootstrap: peer address length " + std::to_string(r_addr_len));
  std::string name(r_name_len, '\0');
  std::vector<uint8_t> addr(r_addr_len);
  AFD_RETURN_IF_ERROR(recv_all(fd, name.data(), name.size(), deadline));
  AFD_RETURN_IF_ERROR(recv_all(fd, addr.data(), addr.size(), deadline));
  if (name == opt_.name) return invalid_argument("bootstrap: the peer has our own name '" + name + "'");
  // Round 2: the id each side gives the other.
  PeerId id;
  uint16_t mine16 = 0;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    id = intern_peer(name);
    if (id != kNoPeer) {
      Peer& p = peers_[id];
      p.stamp_issued = static_cast<uint8_t>(p.stamp_issued % kStamps + 1);
      mine16 = source_field(id, p.stamp_issued);
    }
  }
  if (id == kNoPeer) return resource_exhausted("bootstrap: too many peers");
  uint32_t mine = mine16, theirs = 0;
  AFD_RETURN_IF_ERROR(send_all(fd, &mine, 4, deadline));
  AFD_RETURN_IF_ERROR(recv_all(fd, &theirs, 4, deadline));
  if (theirs > 0xffffu || (theirs >> kPeerIdBits) == 0) {
    return corrupt_data("bootstrap: peer gave us source field " + std::to_string(theirs));
  }
  Command c;
  c.kind = Command::add_peer;
  c.peer = id;
  c.addr = std::move(addr);
  c.src_id_there = static_cast<uint16_t>(theirs);
  c.recv_src = mine16;
  c.fd = fd;
  c.detail = dialed.empty() ? "accepted" : "dialed " + dialed;
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    if (stop_.load()) return unavailable("closed");
    cmds_.push_back(std::move(c));
    n_cmds_.fetch_add(1);
  }
  wake();
  *out_peer = id;
  return Status::ok();
}

void UcxTransportImpl::bootstrap_loop() {
  while (!stop_.load()) {
    int lfd;
    {
      std::lock_guard<std::mutex> lk(peers_mu_);
      lfd = listen_fd_;
    }
    if (lfd >= 0) {
      auto fd = tcp_accept(lfd, 20);
      if (fd.ok() && *fd >= 0) {
        PeerId p;
        Status s = exchange(*fd, "", &p);
        if (!s.is_ok()) {
          spdlog::warn("ucx: {} refused an incoming connection: {}", opt_.name, s.to_string());
          close_fd(*fd);
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::vector<Wanted> wanted;
    {
      std::lock_guard<std::mutex> lk(peers_mu_);
      wanted = wanted_;
    }
    for (size_t i = 0; i < wanted.size(); ++i) {
      // Closing: the progress thread drops every connection as it stops; re-dialling them
      // would only connect to each peer once more and leave it again.
      if (stop_.load()) break;
      Wanted& w = wanted[i];
      int64_t t = now_ns();
      if (w.peer != kNoPeer && is_connected(w.peer)) continue;
      if (t < w.next_try) continue;
      // A freshly lost peer: wait until the progress thread has torn the old connection down.
      auto fd = tcp_connect(w.address, 1000);
      Status s = fd.status();
      if (fd.ok()) {
        PeerId p;
        s = exchange(*fd, w.address, &p);
        if (s.is_ok()) {
          w.peer = p;
          w.backoff_ms = 0;
          // Give the progress thread time to install the endpoint before checking again.
          w.next_try = now_ns() + 200000000;
        } else {
          close_fd(*fd);
        }
      }
      if (!s.is_ok()) {
        w.backoff_ms = w.backoff_ms == 0 ? opt_.connect_retry_ms : std::min(2000, w.backoff_ms * 2);
        w.next_try = t + int64_t{w.backoff_ms} * 1000000;
        if (t >= w.next_log) {
          spdlog::info("ucx: {} waiting for peer at {} ({}); retrying", opt_.name, w.address, s.message());
          w.next_log = t + 2000000000;
        }
      }
      std::lock_guard<std::mutex> lk(peers_mu_);
      for (auto& ww : wanted_) {
        if (ww.address == w.address) ww = w;
      }
    }
  }
}

void UcxTransportImpl::close() {
  std::lock_guard<std::mutex> lk(close_mu_);
  if (closed_) return;
  closed_ = true;
  {
    std::lock_guard<std::mutex> c(cmd_mu_);
    stop_.store(true);
  }
  sleeping_.store(true);
  wake();
  if (bootstrap_.joinable()) bootstrap_.join();
  if (progress_.joinable()) progress_.join();
  if (listen_fd_ >= 0) close_fd(listen_fd_);
  listen_fd_ = -1;
  lock_worker();
  for (auto& reg : regions_) ucp_mem_unmap(context_, reg.memh);
  regions_.clear();
  if (worker_) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  for (OpCtx* ctx : ctx_pool_) delete ctx;
  ctx_pool_.clear();
  unlock_worker();
  if (context_) ucp_cleanup(context_);
  context_ = nullptr;
  if (epfd_ >= 0) ::close(epfd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  epfd_ = wake_fd_ = -1;
}

}  // namespace

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(UcxOptions opt) {
  auto t = std::make_unique<UcxTransportImpl>(std::move(opt));
  Status s = t->init();
  if (!s.is_ok()) return s.with_context("ucx transport");
  return std::unique_ptr<UcxTransport>(std::move(t));
}

}  // namespace afd::comm
