// The peer table, the bootstrap thread (accept, dial, handshake) and the endpoints it
// leads to: made (add_peer) and lost (lose_peer).
#include <sys/epoll.h>

#include <algorithm>

#include "comm/socket_util.h"
#include "comm/ucx/bootstrap.h"
#include "comm/ucx/transport_impl.h"
#include "core/log.h"
#include "core/timer.h"

namespace afd::comm::ucx {

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

PeerId UcxTransportImpl::peer_count() const {
  std::lock_guard<std::mutex> lk(peers_mu_);
  return n_peers_;
}

Status UcxTransportImpl::listen(const std::string& address) {
  std::lock_guard<std::mutex> lk(peers_mu_);
  if (listen_fd_ >= 0) return invalid_argument("ucx transport '" + opt_.name + "' already listens");
  uint16_t port = 0;
  AFD_ASSIGN_OR_RETURN(int fd, tcp_listen(address, &port));
  listen_fd_ = fd;
  listen_port_ = port;
  spdlog::info("ucx: {} listening for peers on {} (port {})", opt_.name, address, port);
  return Status();
}

Status UcxTransportImpl::connect(const std::string& address) {
  AFD_RETURN_IF_ERROR(parse_host_port(address).status());
  std::lock_guard<std::mutex> lk(peers_mu_);
  for (auto& w : wanted_) {
    if (w.address == address) return Status();
  }
  wanted_.push_back(Wanted{address});
  return Status();
}

Status UcxTransportImpl::stop_connecting(const std::string& address) {
  std::lock_guard<std::mutex> lk(peers_mu_);
  const size_t before = wanted_.size();
  std::erase_if(wanted_, [&](const Wanted& w) { return w.address == address; });
  if (wanted_.size() != before) spdlog::info("ucx: {} no longer dials {}", opt_.name, address);
  return Status();
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

Status UcxTransportImpl::exchange(int fd, const std::string& dialed, PeerId* out_peer) {
  const int64_t deadline = now_ns() + int64_t{opt_.bootstrap_timeout_ms} * 1000000;
  AFD_ASSIGN_OR_RETURN(Hello theirs,
                       exchange_hello(fd, Hello{opt_.name, worker_address_}, deadline, dialed, opt_.bootstrap_timeout_ms));
  if (theirs.name == opt_.name) return invalid_argument("bootstrap: the peer has our own name '" + theirs.name + "'");
  PeerId id;
  uint16_t mine = 0;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    id = intern_peer(theirs.name);
    if (id != kNoPeer) {
      Peer& p = peers_[id];
      p.stamp_issued = static_cast<uint8_t>(p.stamp_issued % kStamps + 1);
      mine = source_field(id, p.stamp_issued);
    }
  }
  if (id == kNoPeer) return resource_exhausted("bootstrap: too many peers");
  AFD_ASSIGN_OR_RETURN(uint16_t there, exchange_source_fields(fd, mine, deadline));
  Command c;
  c.kind = Command::add_peer;
  c.peer = id;
  c.addr = std::move(theirs.worker_address);
  c.src_id_there = there;
  c.recv_src = mine;
  c.fd = fd;
  c.detail = dialed.empty() ? "accepted" : "dialed " + dialed;
  if (!push_command(std::move(c))) return unavailable("closed");
  *out_peer = id;
  return Status();
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
      {
        // stop_connecting() since the copy was taken: not dialled again.
        std::lock_guard<std::mutex> lk(peers_mu_);
        if (std::none_of(wanted_.begin(), wanted_.end(), [&](const Wanted& x) { return x.address == w.address; }))
          continue;
      }
      int64_t t = now_ns();
      // A freshly lost peer is dialled again once the progress thread has torn the old
      // connection down (is_connected turns false).
      if (w.peer != kNoPeer && is_connected(w.peer)) continue;
      if (t < w.next_try) continue;
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
  events_.push(PeerEvent{PeerEventKind::connected, c.peer, name, c.detail});
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
  events_.push(PeerEvent{PeerEventKind::disconnected, pid, name, why});
}

}  // namespace afd::comm::ucx
