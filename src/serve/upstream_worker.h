// FrontendWorker: what a front end knows of one attention worker process (its address, the
// health poll's verdict, the load placed on it, its counters). Shared by the front end's
// health thread, its proxy sessions and their upstream threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

namespace afd::serve {

// Per attention worker state; shared with in-flight proxy calls (which may outlive a request handler).
struct FrontendWorker {
  int index = 0;
  std::string address, host;
  int port = 0;
  std::atomic<bool> up{false};
  std::atomic<bool> ever_up{false};
  std::atomic<int64_t> inflight_tokens{0};  // prompt + max_tokens of requests being proxied
  std::atomic<int64_t> inflight_requests{0};
  std::atomic<uint64_t> requests{0};        // placed here
  std::atomic<uint64_t> failures{0};        // connection refused, broken or silent mid-response
  // Why its last health check failed ("" while up): no answer, or the worker's own reason
  // (e.g. its FFN worker is not connected).
  std::string why_down() const {
    std::lock_guard<std::mutex> l(why_mu);
    return why;
  }
  void set_why_down(std::string w) {
    std::lock_guard<std::mutex> l(why_mu);
    why = std::move(w);
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

// "worker 0: <why>; worker 1: <why>" over the workers that are down ("" if none).
inline std::string why_workers_down(const std::vector<std::shared_ptr<FrontendWorker>>& ws) {
  std::string out;
  for (const auto& w : ws) {
    if (w->up.load()) continue;
    out += (out.empty() ? "" : "; ") + ("worker " + std::to_string(w->index) + ": " + w->why_down());
  }
  return out;
}

}  // namespace afd::serve
