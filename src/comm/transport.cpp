#include "comm/transport.h"

#include <chrono>
#include <thread>

#include "core/log.h"
#include "core/timer.h"

namespace afd::comm {

Result<PeerId> wait_for_peer(Transport& t, const std::string& name, int64_t deadline_ns, double log_every_s) {
  int64_t next_log = now_ns() + static_cast<int64_t>(log_every_s * 1e9);
  for (;;) {
    auto id = t.peer_id(name);
    if (id.ok() && t.is_connected(*id)) return *id;
    int64_t now = now_ns();
    if (now >= deadline_ns) {
      return timeout_error(std::string(t.kind()) + " transport '" + t.local_name() + "': peer '" + name +
                           "' did not connect before the deadline");
    }
    if (now >= next_log) {
      spdlog::info("{}: waiting for peer '{}'", t.local_name(), name);
      next_log = now + static_cast<int64_t>(log_every_s * 1e9);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void PeerEventQueue::push(PeerEvent ev) {
  std::lock_guard<std::mutex> lk(mu_);
  events_.push_back(std::move(ev));
  cv_.notify_all();
}

bool PeerEventQueue::pop(PeerEvent* ev, int64_t deadline_ns) {
  std::unique_lock<std::mutex> lk(mu_);
  while (events_.empty()) {
    const int64_t t = now_ns();
    if (t >= deadline_ns) return false;
    cv_.wait_for(lk, std::chrono::nanoseconds(std::min<int64_t>(deadline_ns - t, 100000000)));
  }
  *ev = std::move(events_.front());
  events_.pop_front();
  return true;
}

}  // namespace afd::comm
