// Posting sends and receives, their completion callbacks, the operation contexts and
// the live set that a lost peer, a cancel or close() walks.
#include "comm/ucx/transport_impl.h"

namespace afd::comm::ucx {

Status UcxTransportImpl::post_error(uint64_t tag, PeerId peer) const {
  if ((tag & ~kTagMask) != 0) return invalid_argument("transport tag uses more than 48 bits");
  return invalid_argument("ucx transport: unknown peer " + std::to_string(peer));
}

Result<RequestId> UcxTransportImpl::post_send(PeerId peer, uint64_t tag, const void* data, size_t len,
                                              CompletionFn on_done) {
  return enqueue(Command::send, peer, tag, const_cast<void*>(data), len, std::move(on_done));
}

Result<RequestId> UcxTransportImpl::post_recv(PeerId peer, uint64_t tag, void* buf, size_t capacity,
                                              CompletionFn on_done) {
  return enqueue(Command::recv, peer, tag, buf, capacity, std::move(on_done));
}

Result<RequestId> UcxTransportImpl::enqueue(Command::Kind kind, PeerId peer, uint64_t tag, void* buf, size_t len,
                                            CompletionFn&& on_done) {
  if ((tag & ~kTagMask) != 0 || peer >= n_peers_.load(std::memory_order_acquire)) return post_error(tag, peer);
  // Direct path: when nobody is progressing, post on the caller's thread (after whatever
  // is queued, to keep per-tag order) and push it out with one progress call.
  if (lock_.try_lock()) {
    if (worker_ != nullptr && !stop_.load()) {
      if (n_cmds_.load(std::memory_order_acquire) > 0) progress_once(0, true);
      if (kind == Command::send && len <= kImmediateMaxBytes && send_now(peer, tag, buf, len)) {
        if (n_deferred_ > 0) post_deferred();  // the send is out: now the receives before it
        lock_.unlock();
        if (on_done) on_done(Completion{Status(), len});  // after unlocking: it may post
        return RequestTable::finished_id(len);
      }
      Result<RequestId> allocated = table_.allocate(std::move(on_done));
      if (!allocated.ok()) {
        lock_.unlock();
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
      lock_.unlock();
      // No wake here: a woken progress thread would compete for the cores with this
      // caller, which is about to wait. A running progress thread picks the operation up,
      // an idle one is woken by the worker's events, a parked one within
      // WorkerLock::kParkTimeoutUs: the hand-off request makes it run at its next look
      // even if a short wait kept it parked meanwhile.
      lock_.request_handoff();
      return id;
    }
    lock_.unlock();
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
  if (!push_command(std::move(c))) {
    // Not queued, so no other thread knows the id yet.
    table_.complete_exclusive(id, Completion{cancelled("ucx transport '" + opt_.name + "' is closed"), 0});
  }
  return id;
}

OpCtx* UcxTransportImpl::take_ctx(RequestId id, PeerId peer) {
  OpCtx* ctx;
  if (ctx_pool_.empty()) {
    ctx = new OpCtx;
  } else {
    ctx = ctx_pool_.back();
    ctx_pool_.pop_back();
    // Field by field, not `*ctx = OpCtx{}`, which builds a zeroed temporary and copies it
    // back (a store-forwarding stall on every message's path).
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

void UcxTransportImpl::cancel_live(const std::vector<RequestId>& ids) {
  // Looked up one by one: a cancel may complete (and free) other requests synchronously.
  for (RequestId id : ids) {
    if (void* req = live_request(id)) ucp_request_cancel(worker_, req);
  }
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
    c = Completion{Status(), 0};
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
  Completion c = status == UCS_OK ? Completion{Status(), info ? info->length : 0} : self->recv_failure(*r, status);
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
    table_.complete_exclusive(id, Completion{Status(), len});
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
  // UCX 1.13 leaves recv_info.tag_info unfilled (length 0) on immediate completion of an
  // unexpected eager message, so completions always go through the callback.
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

}  // namespace afd::comm::ucx
