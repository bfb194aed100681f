// The ucp context and worker, the progress thread, the command queue, and close().
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>

#include "comm/socket_util.h"
#include "comm/ucx/transport_impl.h"
#include "core/log.h"
#include "core/timer.h"

namespace afd::comm {

namespace ucx {

UcxTransportImpl::UcxTransportImpl(UcxOptions opt)
    : opt_(std::move(opt)), table_(kMaxInFlight, std::min<int64_t>(opt_.waiter_spin_ns, 20000)) {
  for (uint32_t i = 0; i < kMaxInFlight; ++i) recv_ops_[i].self = this;
}

Status UcxTransportImpl::init() {
  if (opt_.name.empty() || opt_.name.size() > 255) return invalid_argument("ucx transport: name must be 1..255 bytes");
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return unavailable(ucs_error("ucp_config_read", st));
  ucp_params_t params{};
  // No mt_workers_shared (its context lock would be taken on every rendezvous message):
  // ucp_mem_map / unmap run under the worker lock instead.
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return unavailable(ucs_error("ucp_init", st));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // one thread at a time: the holder of lock_
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
  AFD_RETURN_IF_ERROR(lock_.init());
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) return io_error("ucx transport: epoll creation failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = worker_efd_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, worker_efd_, &ev);
  ev.data.fd = lock_.wake_fd();
  epoll_ctl(epfd_, EPOLL_CTL_ADD, lock_.wake_fd(), &ev);
  progress_ = std::thread([this] { progress_loop(); });
  bootstrap_ = std::thread([this] { bootstrap_loop(); });
  return Status();
}

bool UcxTransportImpl::push_command(Command c) {
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    if (stop_.load()) return false;
    cmds_.push_back(std::move(c));
    n_cmds_.fetch_add(1, std::memory_order_seq_cst);
  }
  lock_.wake();
  return true;
}

void UcxTransportImpl::cancel(RequestId id) {
  Command c;
  c.kind = Command::cancel;
  c.id = id;
  push_command(std::move(c));
}

Status UcxTransportImpl::disconnect(PeerId peer) {
  Command c;
  c.kind = Command::drop_peer;
  c.peer = peer;
  c.detail = "disconnected on request";
  if (!push_command(std::move(c))) return unavailable("ucx transport closed");
  return Status();
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

void UcxTransportImpl::reap_closing() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(*it) != UCS_INPROGRESS) {
      ucp_request_free(*it);
      it = closing_.erase(it);
    } else {
      ++it;
    }
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
  handle_failed_endpoints();
  reap_closing();
  if (now != 0 && now >= next_liveness_.load(std::memory_order_relaxed)) {
    check_liveness();
    next_liveness_.store(now + kLivenessPeriodNs, std::memory_order_relaxed);
  }
  return active;
}

void UcxTransportImpl::progress_loop() {
  int64_t last_active = now_ns();
  while (!stop_.load(std::memory_order_relaxed)) {
    if (lock_.should_park()) {
      lock_.park();
      last_active = now_ns();
      continue;
    }
    // A caller holding the worker is driving it: a waiter keeps it across its polling
    // turns and runs the queued commands, the failed endpoints and the liveness checks
    // itself. So this thread does not queue for it (lock() raises wanted(), which would
    // make that waiter let go, pause and take the lock again on every turn until this
    // thread, which shares a core with it when cores are few, gets in). It waits out a
    // short holder (a post) and otherwise sleeps while the worker stays held, the hand-off
    // kept raised for its next look.
    if (!lock_.try_lock()) {
      for (int i = 0; i < 16 && lock_.locked(); ++i) cpu_relax();
      if (!lock_.try_lock()) {
        lock_.park_behind_holder();
        continue;
      }
    }
    bool active = progress_once(now_ns(), true);
    lock_.unlock();
    int64_t t = now_ns();
    if (active) {
      last_active = t;
      continue;
    }
    if (t - last_active < opt_.progress_spin_ns) {
      // Polling, but never hold a core another runnable thread (the caller waiting on a
      // completion, typically) needs: a spinning progress thread would cost that thread a
      // whole scheduler time slice per message on a busy machine.
      std::this_thread::yield();
      continue;
    }
    // Idle: sleep on the worker's event fd, the wake fd and the liveness sockets.
    lock_.lock();
    ucs_status_t armed = ucp_worker_arm(worker_);
    lock_.unlock();
    if (armed == UCS_ERR_BUSY) continue;
    lock_.begin_sleep();
    if (n_cmds_.load(std::memory_order_seq_cst) == 0 && !stop_.load()) {
      epoll_event evs[16];
      int n = epoll_wait(epfd_, evs, 16, 50);
      for (int i = 0; i < n; ++i) {
        if (evs[i].data.fd == lock_.wake_fd()) {
          lock_.drain_wake_fd();
        } else if (evs[i].data.fd != worker_efd_) {
          next_liveness_ = 0;
        }
      }
    }
    lock_.end_sleep();
    last_active = now_ns() - opt_.progress_spin_ns + 200000;  // spin briefly after waking
  }
  shut_down_worker();
}

void UcxTransportImpl::shut_down_worker() {
  lock_.lock();
  // Fail queued commands, cancel what is in flight (deferred receives posted first, so
  // they are), close endpoints.
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
  const PeerId n = peer_count();
  for (PeerId i = 0; i < n; ++i) lose_peer(i, peers_[i].gen, "transport closed");
  {
    std::vector<RequestId> to_cancel = live_recvs(kNoPeer, /*mark_lost=*/false);
    for (OpCtx* ctx = live_head_; ctx != nullptr; ctx = ctx->live_next) to_cancel.push_back(ctx->id);
    cancel_live(to_cancel);
  }
  int64_t deadline = now_ns() + 2000000000;
  while ((n_live_.load(std::memory_order_relaxed) > 0 || !closing_.empty()) && now_ns() < deadline) {
    ucp_worker_progress(worker_);
    reap_closing();
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
  lock_.unlock();
}

void UcxTransportImpl::close() {
  std::lock_guard<std::mutex> lk(close_mu_);
  if (closed_) return;
  closed_ = true;
  {
    std::lock_guard<std::mutex> c(cmd_mu_);
    stop_.store(true);
  }
  lock_.wake_always();
  if (bootstrap_.joinable()) bootstrap_.join();
  if (progress_.joinable()) progress_.join();
  {
    std::lock_guard<std::mutex> p(peers_mu_);
    if (listen_fd_ >= 0) close_fd(listen_fd_);
    listen_fd_ = -1;
  }
  lock_.lock();
  for (void* memh : regions_.take_all()) ucp_mem_unmap(context_, static_cast<ucp_mem_h>(memh));
  if (worker_) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  for (OpCtx* ctx : ctx_pool_) delete ctx;
  ctx_pool_.clear();
  lock_.unlock();
  if (context_) ucp_cleanup(context_);
  context_ = nullptr;
  if (epfd_ >= 0) ::close(epfd_);
  epfd_ = -1;
}

}  // namespace ucx

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(UcxOptions opt) {
  auto t = std::make_unique<ucx::UcxTransportImpl>(std::move(opt));
  Status s = t->init();
  if (!s.is_ok()) return s.with_context("ucx transport");
  return std::unique_ptr<UcxTransport>(std::move(t));
}

}  // namespace afd::comm
