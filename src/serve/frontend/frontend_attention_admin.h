// AttentionAdmin: the front end's `GET/POST /admin/attention` (docs/MEMBERSHIP.md, "Attention
// workers joining and leaving"): attention workers join and leave a running deployment.
//
//   GET  /admin/attention -> 200 {"workers": [{"worker", "address", "state": "up"|"down"|"draining",
//                            "why"?, "inflight_requests", "inflight_tokens", "requests"}],
//                            "joins": n, "leaves": n}
//   POST {"add": "host:port"}        -> 200 {"worker", "address", "result": "added"|"active again"}:
//                                       a new slot (index = the number of slots so far), or the
//                                       slot of a worker removed or draining at that address;
//                                       409 if it is already an active member; 400 if the
//                                       address is not host:port or the slots are exhausted.
//   POST {"remove": "host:port"|i}   -> 200 {"worker", "address", "result": "draining"|"removed",
//                                       "inflight_requests", "moved"?}; 404 no such member, 409
//                                       the last active worker (the deployment would serve
//                                       nothing). With "migrate": true its requests in flight
//                                       are moved to the other workers (the failover
//                                       continuation, serve/proxy_session.h) instead of
//                                       finishing there.
//
// A worker added is polled by the health thread like the others (its /health, identity, and
// the FFN membership set through /admin/ffn: serve/frontend/frontend_ffn_admin.h) and placed on once
// that passes. A removed worker drains: no new request and no continuation is placed there;
// its requests in flight finish there (a failure there continues them elsewhere as any
// failover does), or with migrate are continued elsewhere now; once none is left (settle(), from the health thread) it is removed: no
// longer polled, listed, federated or given FFN changes, and its prefix index is forgotten.
// Slots are never reused by another address (a worker's index names one address for the
// front end's life). Every change is logged with what, who asked and the slot.
//
// Thread-safe: one change at a time (mu_); the request path reads only the workers' atomics.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/scheduling/router.h"
#include "serve/frontend/upstream_worker.h"

namespace afd::serve {

class AttentionAdmin {
 public:
  // workers, router: the front end's (outlive this); max_slots bounds the slots ever made.
  AttentionAdmin(WorkerRoster* workers, Router* router, size_t max_slots = 256);

  // One /admin/attention request of a client (already authorized): HTTP status and JSON body.
  std::pair<int, std::string> request(const std::string& method, const std::string& body);

  // The operations behind POST; `origin` names who asked in the log ("/admin/attention",
  // "topology file reload"). HTTP status and JSON body as for POST.
  std::pair<int, std::string> add(const std::string& address, const std::string& origin);
  std::pair<int, std::string> remove(const std::string& address_or_index, const std::string& origin,
                                     bool migrate = false);
  // What "migrate" calls: moves the requests in flight on w to other workers; how many.
  void set_migrate(std::function<int(const FrontendWorker& w)> migrate) { migrate_ = std::move(migrate); }
  // Makes the active members exactly `addresses` (adds the missing, removes the others, keeps
  // the order of slots): 200 {"added": [...], "removed": [...]}, or the first refusal's
  // status and body (changes before it stay; none is refused for a list that is valid and
  // not empty: every address is checked before anything changes).
  std::pair<int, std::string> set(const std::vector<std::string>& addresses, const std::string& origin);

  // Health thread: draining workers with no request in flight are removed. Returns how many.
  int settle();

  // afd_frontend_attention_* series (Prometheus text).
  std::string render_metrics() const;

 private:
  // mu_ held: the listed worker at `address` or with index `which` (nullptr if none).
  std::shared_ptr<FrontendWorker> find(const std::string& address_or_index, bool listed_only) const;
  void finish_removal(FrontendWorker& w);  // mu_ held: draining -> removed

  WorkerRoster* workers_;
  Router* router_;
  std::function<int(const FrontendWorker&)> migrate_;  // empty: "migrate" is refused
  size_t max_slots_;
  mutable std::mutex mu_;
  uint64_t joins_ = 0;   // adds applied (new slots and returns)
  uint64_t leaves_ = 0;  // removals applied (drains begun)
};

}  // namespace afd::serve
