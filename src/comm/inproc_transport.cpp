#include "comm/inproc_transport.h"

#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/timer.h"

namespace afd::comm {

// The receiving half of an InprocTransport, shared with its peers' progress threads.
// Lock order: hub mutex -> transport peers_mu_ -> port mu. Copies run under `mu`, so a
// closing owner (which takes `mu`) never frees a buffer while a copy writes into it.
struct InprocPort {
  struct PostedRecv {
    RequestId id;
    PeerId src;  // the owner's PeerId for the sender
    uint64_t tag;
    void* buf;
    size_t cap;
  };
  struct PendingSend {
    RequestId id;
    std::shared_ptr<RequestTable> sender_table;
    PeerId src;
    uint64_t tag;
    const void* data;
    size_t len;
  };
  std::mutex mu;
  bool alive = true;
  std::shared_ptr<RequestTable> table;
  std::deque<PostedRecv> recvs;
  std::deque<PendingSend> sends;
  // Per sender (the owner's PeerId for it): bumped when a link to it is made or lost. A send
  // or receive checks, under mu, the epoch it was issued under: one that raced a disconnect
  // fails instead of waiting in this port for the next connection's messages — where a
  // send's buffer may already be gone.
  std::unordered_map<PeerId, uint64_t> link_epoch;
};

namespace {
Completion ok_bytes(size_t n) { return Completion{Status(), n}; }
Status too_long(size_t len, size_t cap, const std::string& from) {
  return resource_exhausted("message of " + std::to_string(len) + " bytes from " + from +
                            " exceeds the posted receive buffer of " + std::to_string(cap) + " bytes");
}
}  // namespace

Result<std::unique_ptr<InprocTransport>> InprocTransport::create(std::shared_ptr<InprocHub> hub, std::string name,
                                                                 InprocOptions opt) {
  if (!hub) return invalid_argument("inproc transport: no hub");
  if (name.empty()) return invalid_argument("inproc transport: empty name");
  std::unique_ptr<InprocTransport> t(new InprocTransport(hub, name, opt));
  {
    std::lock_guard<std::mutex> lk(hub->mu_);
    if (hub->by_name_.count(name)) return invalid_argument("inproc transport: name '" + name + "' is already open");
    hub->by_name_[name] = t.get();
  }
  t->progress_ = std::thread([p = t.get()] { p->progress_loop(); });
  return t;
}

InprocTransport::InprocTransport(std::shared_ptr<InprocHub> hub, std::string name, InprocOptions opt)
    : hub_(std::move(hub)), name_(std::move(name)), opt_(opt),
      table_(std::make_shared<RequestTable>(8192, opt.spin_ns)), port_(std::make_shared<InprocPort>()) {
  port_->table = table_;
}

InprocTransport::~InprocTransport() { close(); }

TransportCaps InprocTransport::caps() const {
  TransportCaps c;
  c.inter_process = false;
  c.registered_memory = false;
  c.zero_copy = false;  // one copy, sender buffer -> receiver buffer, no staging
  c.disconnect_peer = true;
  return c;
}

PeerId InprocTransport::intern_peer(const std::string& name) {
  auto it = peer_ids_.find(name);
  if (it != peer_ids_.end()) return it->second;
  PeerId id = static_cast<PeerId>(peers_.size());
  peers_.push_back(PeerLink{name, nullptr, kNoPeer, ""});
  peer_ids_[name] = id;
  return id;
}

Status InprocTransport::listen(const std::string& address) {
  std::lock_guard<std::mutex> lk(hub_->mu_);
  if (closed_) return unavailable("inproc transport '" + name_ + "' is closed");
  if (!listen_address_.empty()) return invalid_argument("inproc transport '" + name_ + "' already listens");
  if (hub_->listeners_.count(address)) return invalid_argument("inproc address '" + address + "' is already in use");
  hub_->listeners_[address] = this;
  listen_address_ = address;
  return Status();
}

Status InprocTransport::connect(const std::string& address) {
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    for (auto& w : wanted_) {
      if (w == address) return Status();
    }
    wanted_.push_back(address);
  }
  try_reconnect();
  return Status();
}

Status InprocTransport::stop_connecting(const std::string& address) {
  std::lock_guard<std::mutex> lk(peers_mu_);
  std::erase(wanted_, address);
  return Status();
}

void InprocTransport::link(InprocTransport* a, InprocTransport* b, const std::string& address_of_b) {
  PeerId pa, pb;
  {
    std::lock_guard<std::mutex> la(a->peers_mu_);
    pa = a->intern_peer(b->name_);
  }
  {
    std::lock_guard<std::mutex> lb(b->peers_mu_);
    pb = b->intern_peer(a->name_);
  }
  uint64_t ea, eb;  // new link epochs: a's port for b (pa), b's port for a (pb)
  {
    std::lock_guard<std::mutex> l(a->port_->mu);
    ea = ++a->port_->link_epoch[pa];
  }
  {
    std::lock_guard<std::mutex> l(b->port_->mu);
    eb = ++b->port_->link_epoch[pb];
  }
  {
    std::lock_guard<std::mutex> lb(b->peers_mu_);
    b->peers_[pb].remote = a->port_;
    b->peers_[pb].my_id_there = pa;
    b->peers_[pb].epoch_there = ea;
    b->peers_[pb].epoch_here = eb;
  }
  {
    std::lock_guard<std::mutex> la(a->peers_mu_);
    a->peers_[pa].remote = b->port_;
    a->peers_[pa].my_id_there = pb;
    a->peers_[pa].epoch_there = eb;
    a->peers_[pa].epoch_here = ea;
    a->peers_[pa].address = address_of_b;
  }
  spdlog::info("inproc: {} connected to {} at '{}'", a->name_, b->name_, address_of_b);
  a->push_event(PeerEvent{PeerEventKind::connected, pa, b->name_, address_of_b});
  b->push_event(PeerEvent{PeerEventKind::connected, pb, a->name_, ""});
}

void InprocTransport::try_reconnect() {
  std::vector<std::string> wanted;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    wanted = wanted_;
  }
  for (const auto& address : wanted) {
    std::lock_guard<std::mutex> lk(hub_->mu_);
    if (closed_) return;
    auto it = hub_->listeners_.find(address);
    if (it == hub_->listeners_.end() || it->second == this) continue;
    InprocTransport* b = it->second;
    bool linked = false;
    {
      std::lock_guard<std::mutex> pl(peers_mu_);
      auto id = peer_ids_.find(b->name_);
      linked = id != peer_ids_.end() && peers_[id->second].remote != nullptr;
    }
    if (!linked) link(this, b, address);
  }
}

void InprocTransport::on_peer_lost(PeerId peer, const std::string& why, bool closing) {
  std::string name;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    if (peer >= peers_.size() || peers_[peer].remote == nullptr) return;
    peers_[peer].remote = nullptr;
    peers_[peer].my_id_there = kNoPeer;
    name = peers_[peer].name;
  }
  {
    std::lock_guard<std::mutex> lk(port_->mu);
    ++port_->link_epoch[peer];  // operations issued under the lost link can no longer land here
    Status lost = unavailable("peer '" + name + "' disconnected: " + why);
    for (auto it = port_->recvs.begin(); it != port_->recvs.end();) {
      if (it->src == peer) {
        table_->complete(it->id, Completion{lost, 0});
        it = port_->recvs.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = port_->sends.begin(); it != port_->sends.end();) {
      if (it->src == peer) {
        it->sender_table->complete(it->id, Completion{unavailable("peer '" + name_ + "' lost the connection"), 0});
        it = port_->sends.erase(it);
      } else {
        ++it;
      }
    }
  }
  // A close is an expected end (both sides: this one's own, and its peers being told):
  // info, not a warning; a connection dropped on request, or a peer lost otherwise, warns.
  if (closing) {
    spdlog::info("inproc: {} lost peer {}: {}", name_, name, why);
  } else {
    spdlog::warn("inproc: {} lost peer {}: {}", name_, name, why);
  }
  push_event(PeerEvent{PeerEventKind::disconnected, peer, name, why});
}

Status InprocTransport::disconnect(PeerId peer) {
  std::lock_guard<std::mutex> lk(hub_->mu_);
  std::string name;
  PeerId there;
  {
    std::lock_guard<std::mutex> pl(peers_mu_);
    if (peer >= peers_.size()) return invalid_argument("inproc disconnect: unknown peer " + std::to_string(peer));
    if (peers_[peer].remote == nullptr) return Status();
    name = peers_[peer].name;
    there = peers_[peer].my_id_there;
  }
  auto it = hub_->by_name_.find(name);
  if (it != hub_->by_name_.end()) it->second->on_peer_lost(there, "'" + name_ + "' dropped the connection");
  on_peer_lost(peer, "disconnected on request");
  return Status();
}

void InprocTransport::push_event(PeerEvent ev) { events_.push(std::move(ev)); }

bool InprocTransport::next_event(PeerEvent* ev, int64_t deadline_ns) { return events_.pop(ev, deadline_ns); }

Result<PeerId> InprocTransport::peer_id(const std::string& name) const {
  std::lock_guard<std::mutex> lk(peers_mu_);
  auto it = peer_ids_.find(name);
  if (it == peer_ids_.end()) return not_found("inproc transport '" + name_ + "' has never seen peer '" + name + "'");
  return it->second;
}

std::string InprocTransport::peer_name(PeerId peer) const {
  std::lock_guard<std::mutex> lk(peers_mu_);
  return peer < peers_.size() ? peers_[peer].name : "?";
}

bool InprocTransport::is_connected(PeerId peer) const {
  std::lock_guard<std::mutex> lk(peers_mu_);
  return peer < peers_.size() && peers_[peer].remote != nullptr;
}

Result<RequestId> InprocTransport::enqueue(Command c, CompletionFn on_done) {
  if ((c.tag & ~kTagMask) != 0) return invalid_argument("transport tag uses more than 48 bits");
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    if (c.peer >= peers_.size()) return invalid_argument("inproc transport: unknown peer " + std::to_string(c.peer));
  }
  AFD_ASSIGN_OR_RETURN(c.id, table_->allocate(std::move(on_done)));
  std::atomic<int>& queued = c.kind == Command::send ? queued_sends_ : queued_recvs_;
  if ((c.kind == Command::recv || c.len <= kInlineCopyMax) && queued.load(std::memory_order_acquire) == 0) {
    inline_posts_.fetch_add(1, std::memory_order_seq_cst);
    bool closing = stop_.load(std::memory_order_seq_cst);
    Finishes f;
    if (!closing) run(c, f);
    inline_posts_.fetch_sub(1, std::memory_order_seq_cst);
    f.deliver();
    if (!closing) return c.id;
  }
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    if (stop_.load()) {
      table_->complete(c.id, Completion{cancelled("inproc transport '" + name_ + "' is closed"), 0});
      return c.id;
    }
    queued.fetch_add(1, std::memory_order_release);
    cmds_.push_back(c);
  }
  cmd_cv_.notify_one();
  return c.id;
}

Result<RequestId> InprocTransport::post_send(PeerId peer, uint64_t tag, const void* data, size_t len,
                                             CompletionFn on_done) {
  return enqueue(Command{Command::send, 0, peer, tag, const_cast<void*>(data), len}, std::move(on_done));
}

Result<RequestId> InprocTransport::post_recv(PeerId peer, uint64_t tag, void* buf, size_t capacity,
                                             CompletionFn on_done) {
  return enqueue(Command{Command::recv, 0, peer, tag, buf, capacity}, std::move(on_done));
}

void InprocTransport::cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    if (stop_.load()) return;
    cmds_.push_back(Command{Command::cancel, id, kNoPeer, 0, nullptr, 0});
  }
  cmd_cv_.notify_one();
}

void InprocTransport::do_send(const Command& c, Finishes& f) {
  std::shared_ptr<InprocPort> remote;
  PeerId src;
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    remote = peers_[c.peer].remote;
    src = peers_[c.peer].my_id_there;
    epoch = peers_[c.peer].epoch_there;
  }
  if (!remote) {
    f.add(table_.get(), nullptr, c.id, Completion{unavailable("peer '" + peer_name(c.peer) + "' is not connected"), 0});
    return;
  }
  {
    std::lock_guard<std::mutex> lk(remote->mu);
    if (remote->alive && remote->link_epoch[src] == epoch) {
      for (auto it = remote->recvs.begin(); it != remote->recvs.end(); ++it) {
        if (it->src != src || it->tag != c.tag) continue;
        if (c.len > it->cap) {
          f.add(remote->table.get(), remote->table, it->id, Completion{too_long(c.len, it->cap, name_), 0});
        } else {
          if (c.len) std::memcpy(it->buf, c.buf, c.len);
          f.add(remote->table.get(), remote->table, it->id, ok_bytes(c.len));
        }
        remote->recvs.erase(it);
        f.add(table_.get(), nullptr, c.id, ok_bytes(c.len));
        return;
      }
      remote->sends.push_back(InprocPort::PendingSend{c.id, table_, src, c.tag, c.buf, c.len});
      return;
    }
  }
  // Named outside the port lock (lock order: peers_mu_ before a port's mu).
  f.add(table_.get(), nullptr, c.id,
        Completion{unavailable("peer '" + peer_name(c.peer) + "' is closed or was disconnected"), 0});
}

void InprocTransport::do_recv(const Command& c, Finishes& f) {
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    if (peers_[c.peer].remote == nullptr) {
      f.add(table_.get(), nullptr, c.id,
            Completion{unavailable("peer '" + peers_[c.peer].name + "' is not connected"), 0});
      return;
    }
    epoch = peers_[c.peer].epoch_here;
  }
  bool stale = false;    // the link was lost (and maybe remade) since the check above
  size_t overlong = 0;  // a matched message longer than the buffer: its length
  {
    std::lock_guard<std::mutex> lk(port_->mu);
    if (!port_->alive) {
      f.add(table_.get(), nullptr, c.id, Completion{cancelled("inproc transport '" + name_ + "' is closed"), 0});
      return;
    }
    stale = port_->link_epoch[c.peer] != epoch;
    auto it = stale ? port_->sends.end() : port_->sends.begin();
    while (it != port_->sends.end() && (it->src != c.peer || it->tag != c.tag)) ++it;
    if (it == port_->sends.end()) {
      if (!stale) {
        port_->recvs.push_back(InprocPort::PostedRecv{c.id, c.peer, c.tag, c.buf, c.len});
        return;
      }
    } else {
      if (it->len > c.len) {
        overlong = it->len;
      } else {
        if (it->len) std::memcpy(c.buf, it->data, it->len);
        f.add(table_.get(), nullptr, c.id, ok_bytes(it->len));
      }
      RequestTable* st = it->sender_table.get();
      f.add(st, std::move(it->sender_table), it->id, ok_bytes(it->len));
      port_->sends.erase(it);
    }
  }
  // Named outside the port lock (lock order: peers_mu_ before a port's mu).
  if (stale) {
    f.add(table_.get(), nullptr, c.id,
          Completion{unavailable("peer '" + peer_name(c.peer) + "' disconnected while the receive was posted"), 0});
    return;
  }
  if (overlong > 0) f.add(table_.get(), nullptr, c.id, Completion{too_long(overlong, c.len, peer_name(c.peer)), 0});
}

void InprocTransport::do_cancel(const Command& c) {
  if (!table_->is_pending(c.id)) return;
  Status why = cancelled("operation cancelled");
  {
    std::lock_guard<std::mutex> lk(port_->mu);
    for (auto it = port_->recvs.begin(); it != port_->recvs.end(); ++it) {
      if (it->id == c.id) {
        port_->recvs.erase(it);
        table_->complete(c.id, Completion{why, 0});
        return;
      }
    }
  }
  std::vector<std::shared_ptr<InprocPort>> remotes;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    for (auto& p : peers_) {
      if (p.remote) remotes.push_back(p.remote);
    }
  }
  for (auto& r : remotes) {
    std::lock_guard<std::mutex> lk(r->mu);
    for (auto it = r->sends.begin(); it != r->sends.end(); ++it) {
      if (it->id == c.id && it->sender_table == table_) {
        r->sends.erase(it);
        table_->complete(c.id, Completion{why, 0});
        return;
      }
    }
  }
}

void InprocTransport::run(const Command& c, Finishes& f) {
  switch (c.kind) {
    case Command::send: do_send(c, f); break;
    case Command::recv: do_recv(c, f); break;
    case Command::cancel: do_cancel(c); break;
  }
}

void InprocTransport::run_queued(const Command& c) {
  Finishes f;
  run(c, f);
  // Counted down only once run: a later post of this direction stays queued behind it.
  if (c.kind == Command::send) queued_sends_.fetch_sub(1, std::memory_order_release);
  if (c.kind == Command::recv) queued_recvs_.fetch_sub(1, std::memory_order_release);
  f.deliver();
}

void InprocTransport::progress_loop() {
  int64_t next_reconnect = 0;
  std::unique_lock<std::mutex> lk(cmd_mu_);
  for (;;) {
    if (cmds_.empty() && !stop_.load()) {
      cmd_cv_.wait_for(lk, std::chrono::milliseconds(opt_.reconnect_interval_ms));
    }
    if (stop_.load()) break;
    std::deque<Command> batch;
    batch.swap(cmds_);
    lk.unlock();
    for (const auto& c : batch) run_queued(c);
    int64_t t = now_ns();
    if (t >= next_reconnect) {
      try_reconnect();
      next_reconnect = t + int64_t{opt_.reconnect_interval_ms} * 1000000;
    }
    lk.lock();
  }
  // Closing: whatever was still queued finishes as cancelled.
  for (const auto& c : cmds_) {
    if (c.kind != Command::cancel) table_->complete(c.id, Completion{cancelled("transport closed"), 0});
  }
  cmds_.clear();
}

void InprocTransport::close() {
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    if (stop_.load()) return;
    stop_.store(true, std::memory_order_seq_cst);
  }
  cmd_cv_.notify_all();
  if (progress_.joinable()) progress_.join();
  // Posts that got past the stop_ check finish first: none may add to a port once the
  // links below are torn down.
  while (inline_posts_.load(std::memory_order_seq_cst) > 0) std::this_thread::yield();
  std::lock_guard<std::mutex> hub_lock(hub_->mu_);
  closed_ = true;
  if (!listen_address_.empty()) hub_->listeners_.erase(listen_address_);
  hub_->by_name_.erase(name_);
  std::vector<std::pair<PeerId, PeerLink>> linked;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    for (PeerId p = 0; p < peers_.size(); ++p) {
      if (peers_[p].remote) linked.emplace_back(p, peers_[p]);
    }
  }
  for (auto& [p, l] : linked) {
    auto it = hub_->by_name_.find(l.name);
    if (it != hub_->by_name_.end()) it->second->on_peer_lost(l.my_id_there, "'" + name_ + "' closed", /*closing=*/true);
    on_peer_lost(p, "closed locally", /*closing=*/true);
  }
  std::lock_guard<std::mutex> lk(port_->mu);
  port_->alive = false;
  for (auto& r : port_->recvs) table_->complete(r.id, Completion{cancelled("transport closed"), 0});
  for (auto& s : port_->sends) s.sender_table->complete(s.id, Completion{unavailable("peer '" + name_ + "' closed"), 0});
  port_->recvs.clear();
  port_->sends.clear();
}

}  // namespace afd::comm
