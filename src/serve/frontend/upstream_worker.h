// FrontendWorker: what a front end knows of one attention worker process (its address, the
// health poll's verdict, its membership, the load placed on it, its counters). Shared by the
// front end's health thread, its proxy sessions and their upstream threads. WorkerRoster: the
// front end's slots, which only grow (a worker's index is its slot for the process's life).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace afd::serve {

// Membership of an attention worker slot (serve/frontend/frontend_attention_admin.h): active (placed
// on while up), draining (removed by the admin: no new request or continuation is placed
// there, its requests in flight finish there), removed (drained: not polled, not listed).
enum class Membership : uint8_t { active = 0, draining = 1, removed = 2 };

// Per attention worker state; shared with in-flight proxy calls (which may outlive a request handler).
struct FrontendWorker {
  int index = 0;
  std::string address, host;
  int port = 0;
  std::atomic<bool> up{false};  // written by set_state() only
  std::atomic<bool> ever_up{false};
  std::atomic<Membership> membership{Membership::active};
  // Whether requests may be placed here now: up and active.
  bool placeable() const { return up.load() && membership.load() == Membership::active; }
  bool listed() const { return membership.load() != Membership::removed; }
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
  // The system_fingerprint its last ready /health reported ("" if none).
  std::string numerics() const {
    std::lock_guard<std::mutex> l(why_mu);
    return numerics_;
  }
  void set_numerics(std::string fp) {
    std::lock_guard<std::mutex> l(why_mu);
    numerics_ = std::move(fp);
  }

 private:
  mutable std::mutex why_mu;
  std::string why = "not checked yet";
  std::string numerics_;
};

using WorkerList = std::vector<std::shared_ptr<FrontendWorker>>;

// The system_fingerprint the placeable workers share: "" when there is none, or one of them
// reports another or none (the responses then leave the field out).
inline std::string common_numerics(const WorkerList& ws) {
  std::string fp;
  for (const auto& w : ws) {
    if (!w->placeable()) continue;
    const std::string mine = w->numerics();
    if (mine.empty() || (!fp.empty() && mine != fp)) return "";
    fp = mine;
  }
  return fp;
}

// Workers that requests may be placed on (placeable()).
inline int workers_up(const WorkerList& ws) {
  int n = 0;
  for (const auto& w : ws) n += w->placeable() ? 1 : 0;
  return n;
}

// Workers not removed (listed()).
inline int workers_listed(const WorkerList& ws) {
  int n = 0;
  for (const auto& w : ws) n += w->listed() ? 1 : 0;
  return n;
}

// The front end's attention worker slots by index; append-only (a removed worker keeps its
// slot, and an address added again gets its old slot back). Thread-safe: snapshot() is a
// consistent list that later appends do not change.
class WorkerRoster {
 public:
  explicit WorkerRoster(WorkerList initial) : list_(std::make_shared<const WorkerList>(std::move(initial))) {}
  std::shared_ptr<const WorkerList> snapshot() const {
    std::lock_guard<std::mutex> l(mu_);
    return list_;
  }
  // Appends w (its index must be size()); returns the new list.
  std::shared_ptr<const WorkerList> append(std::shared_ptr<FrontendWorker> w) {
    std::lock_guard<std::mutex> l(mu_);
    auto next = std::make_shared<WorkerList>(*list_);
    next->push_back(std::move(w));
    list_ = next;
    return list_;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const WorkerList> list_;
};

}  // namespace afd::serve
