// FrontendWorker: what a front end knows of one attention worker process (its address, the
// health poll's verdict, the load placed on it, its counters). Shared by the front end's
// health thread, its proxy sessions and their upstream threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace afd::serve {

// Per attention worker state; shared with in-flight proxy calls (which may outlive a request handler).
struct FrontendWorker {
  int index = 0;
  std::string address, host;
  int port = 0;
  std::atomic<bool> up{false};  // written by set_state() only
  std::atomic<bool> ever_up{false};
  std::atomic<int64_t> inflight_tokens{0};  // prompt + max_tokens of requests being proxied
  std::atomic<int64_t> inflight_requests{0};
  std::atomic<uint64_t> requests{0};        // placed here
  std::atomic<uint64_t> failures{0};        // exchanges refused, broken or silent mid-response
  // Why it is down ("" while up): its last health check failed (no answer, or the worker's
  // own reason, e.g. its FFN worker is not connected), or a request found it unreachable or
  // refusing. Never "" while down: set_state() fills in an empty reason.
  std::string why_down() const {
    std::lock_guard<std::mutex> l(why_mu);
    return up.load() ? "" : why;
  }
  // Marks it up, or down because of `why`, together (why_down() never sees one without the
  // other). Returns whether it was up.
  bool set_state(bool now_up, std::string why_not) {
    std::lock_guard<std::mutex> l(why_mu);
    why = now_up ? "" : why_not.empty() ? "down (no reason given)" : std::move(why_not);
    return up.exchange(now_up);
  }

 private:
  mutable std::mutex why_mu;
  std::string why = "not checked yet";
};

// Workers whose last health check passed.
inline int workers_up(const std::vector<std::shared_ptr<FrontendWorker>>& ws) {
  int n = 0;
  for (const auto& w : ws) n += w->up.load() ? 1 : 0;
  return n;
}

}  // namespace afd::serve
