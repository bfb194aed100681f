#include "comm/fault_transport.h"

#include <cstring>

#include "core/log.h"
#include "core/timer.h"

namespace afd::comm {

FaultTransport::FaultTransport(std::unique_ptr<Transport> inner, uint64_t seed)
    : inner_(std::move(inner)), kind_(std::string("fault(") + inner_->kind() + ")"), table_(8192, 20000), rng_(seed) {
  thread_ = std::thread([this] { fault_loop(); });
}

FaultTransport::~FaultTransport() { close(); }

TransportCaps FaultTransport::caps() const {
  TransportCaps c = inner_->caps();
  c.fault_injection = true;
  return c;
}

void FaultTransport::set_delay_ns(int64_t delay_ns, PeerId target) {
  std::lock_guard<std::mutex> lk(mu_);
  delay_ns_ = delay_ns;
  delay_target_ = target;
  cv_.notify_all();
}

void FaultTransport::set_stall(bool stalled, PeerId target) {
  std::lock_guard<std::mutex> lk(mu_);
  stalled_ = stalled;
  stall_target_ = target;
  cv_.notify_all();
}

void FaultTransport::drop_next_sends(int n, PeerId target) {
  std::lock_guard<std::mutex> lk(mu_);
  drop_n_ = n;
  drop_target_ = target;
}

void FaultTransport::set_drop_probability(double p, PeerId target) {
  std::lock_guard<std::mutex> lk(mu_);
  drop_p_ = p;
  drop_p_target_ = target;
}

void FaultTransport::corrupt_next_sends(int n, int bytes_to_flip, PeerId target) {
  std::lock_guard<std::mutex> lk(mu_);
  corrupt_n_ = n;
  corrupt_bytes_ = std::max(1, bytes_to_flip);
  corrupt_target_ = target;
}

void FaultTransport::clear_faults() {
  std::lock_guard<std::mutex> lk(mu_);
  delay_ns_ = 0;
  stalled_ = false;
  drop_n_ = 0;
  drop_p_ = 0;
  corrupt_n_ = 0;
  cv_.notify_all();
}

Result<RequestId> FaultTransport::post_send(PeerId peer, uint64_t tag, const void* data, size_t len,
                                            CompletionFn on_done) {
  if ((tag & ~kTagMask) != 0) return invalid_argument("transport tag uses more than 48 bits");
  AFD_ASSIGN_OR_RETURN(RequestId outer, table_.allocate(std::move(on_done)));
  Held h{outer, peer, tag, data, len, 0, nullptr};
  bool hold = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) {
      table_.complete(outer, Completion{cancelled("transport closed"), 0});
      return outer;
    }
    bool drop = false;
    if (drop_n_ > 0 && applies(drop_target_, peer)) {
      --drop_n_;
      drop = true;
    } else if (drop_p_ > 0 && applies(drop_p_target_, peer) &&
               std::uniform_real_distribution<double>(0, 1)(rng_) < drop_p_) {
      drop = true;
    }
    if (drop) {
      spdlog::debug("fault: dropping a {}-byte message to peer {}", len, peer);
      table_.complete(outer, Completion{Status(), len});
      return outer;
    }
    if (corrupt_n_ > 0 && applies(corrupt_target_, peer) && len > 0) {
      --corrupt_n_;
      h.copy = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(data),
                                                      static_cast<const uint8_t*>(data) + len);
      for (int i = 0; i < corrupt_bytes_; ++i) {
        size_t at = std::uniform_int_distribution<size_t>(0, len - 1)(rng_);
        (*h.copy)[at] ^= static_cast<uint8_t>(std::uniform_int_distribution<int>(1, 255)(rng_));
      }
      h.data = h.copy->data();
    }
    bool delayed = delay_ns_ > 0 && applies(delay_target_, peer);
    bool stalled = stalled_ && applies(stall_target_, peer);
    if (delayed || stalled || !held_.empty()) {
      h.due_ns = now_ns() + (delayed ? delay_ns_ : 0);
      held_.push_back(std::move(h));
      hold = true;
      cv_.notify_all();
    }
  }
  if (!hold) forward(std::move(h));
  return outer;
}

void FaultTransport::forward(Held h) {
  RequestId outer = h.outer;
  auto copy = h.copy;  // kept alive until the inner send completes
  auto r = inner_->post_send(h.peer, h.tag, h.data, h.len, [this, outer, copy](const Completion& c) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      inner_of_.erase(outer);
    }
    table_.complete(outer, c);
  });
  if (!r.ok()) {
    table_.complete(outer, Completion{r.status(), 0});
    return;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (table_.is_pending(outer)) inner_of_[outer] = *r;
}

Result<RequestId> FaultTransport::post_recv(PeerId peer, uint64_t tag, void* buf, size_t capacity,
                                            CompletionFn on_done) {
  AFD_ASSIGN_OR_RETURN(RequestId outer, table_.allocate(std::move(on_done)));
  auto r = inner_->post_recv(peer, tag, buf, capacity, [this, outer](const Completion& c) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      inner_of_.erase(outer);
    }
    table_.complete(outer, c);
  });
  if (!r.ok()) {
    table_.complete(outer, Completion{r.status(), 0});
    return outer;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (table_.is_pending(outer)) inner_of_[outer] = *r;
  return outer;
}

void FaultTransport::cancel(RequestId id) {
  RequestId inner = 0;
  bool found_inner = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->outer == id) {
        held_.erase(it);
        table_.complete(id, Completion{cancelled("send cancelled"), 0});
        return;
      }
    }
    auto it = inner_of_.find(id);
    if (it != inner_of_.end()) {
      inner = it->second;
      found_inner = true;
    }
  }
  if (found_inner) inner_->cancel(inner);
}

void FaultTransport::fail_held(PeerId peer, const std::string& why) {
  std::vector<RequestId> lost;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->peer != peer) {
        ++it;
        continue;
      }
      lost.push_back(it->outer);
      it = held_.erase(it);
    }
  }
  for (RequestId id : lost) table_.complete(id, Completion{unavailable(why), 0});
}

Status FaultTransport::disconnect(PeerId peer) {
  fail_held(peer, "peer '" + inner_->peer_name(peer) + "' disconnected while the send was held");
  return inner_->disconnect(peer);
}

bool FaultTransport::next_event(PeerEvent* ev, int64_t deadline_ns) {
  if (!inner_->next_event(ev, deadline_ns)) return false;
  if (ev->kind == PeerEventKind::disconnected)
    fail_held(ev->peer, "peer '" + ev->name + "' disconnected while the send was held: " + ev->detail);
  return true;
}

void FaultTransport::fault_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    if (held_.empty()) {
      cv_.wait(lk);
      continue;
    }
    Held& front = held_.front();
    if (stalled_ && applies(stall_target_, front.peer)) {
      cv_.wait_for(lk, std::chrono::milliseconds(50));
      continue;
    }
    int64_t t = now_ns();
    if (front.due_ns > t) {
      int64_t left = front.due_ns - t;
      if (left > 200000) {
        cv_.wait_for(lk, std::chrono::nanoseconds(left - 100000));
      } else {
        lk.unlock();
        while (now_ns() < front.due_ns) std::this_thread::yield();  // precise last stretch
        lk.lock();
      }
      continue;
    }
    Held h = std::move(front);
    held_.pop_front();
    lk.unlock();
    forward(std::move(h));
    lk.lock();
  }
}

void FaultTransport::close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& h : held_) table_.complete(h.outer, Completion{cancelled("transport closed"), 0});
    held_.clear();
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  inner_->close();
}

}  // namespace afd::comm
