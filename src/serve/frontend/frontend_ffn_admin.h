// FfnFanout: the front end's `GET/POST /admin/ffn` (docs/MEMBERSHIP.md, "FFN membership
// through the front end"). A change (the body of an attention worker's POST /admin/ffn,
// serve/scheduling/ffn_admin.h) is sent to every attention worker that is up, in index order; the first
// one that accepts it defines the resulting membership (its members not removed, in slot
// order), which the front end keeps as the deployment's FFN membership. A worker that was
// down, could not be reached, refused the change, or later answers /health as another
// process (a new `instance`: it restarted and holds its start-up list again) is given the
// whole list (`{"members": [...]}`, which leaves an equal membership unchanged) by the
// health thread, before the front end places requests on it again (reconcile()). Attention
// workers that join later (serve/frontend/frontend_attention_admin.h) get it the same way; removed
// ones are left out.
//
//   GET  /admin/ffn -> 200 {"members": [...]|null, "changes": n, "workers": [{"worker", "address",
//                       "up", "current", "membership"|"error"}]}
//   POST /admin/ffn -> 200 {"members": [...], "changes": n, "workers": [{"worker", "address",
//                       "result": "applied"|"later", "error"?}]}; a worker's refusal of the
//                       first attempt is passed on with its status (nothing changed); 503 when
//                       no attention worker is up.
// Thread-safe: one change or reconciliation talks to the workers at a time (change_mu_); the
// state (mu_) is held only briefly, never over an exchange. The request path takes neither.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/frontend/upstream_worker.h"

namespace afd::serve {

class FfnFanout {
 public:
  // workers: the front end's attention workers (by index; outlives this); timeout_ms bounds
  // each exchange; api_key (may be empty): the front end's, sent to the workers as a Bearer token.
  FfnFanout(const WorkerRoster* workers, int timeout_ms, std::string api_key);

  // One /admin/ffn request of a client (already authorized): HTTP status and JSON body.
  std::pair<int, std::string> request(const std::string& method, const std::string& body);

  // Health thread, for worker w whose /health answered 200 with `instance`: ok when it holds
  // the membership set through request() (or none was set), after giving it the list if it
  // had not got it; else why it could not be given (the worker must not be placed on).
  Status reconcile(const FrontendWorker& w, const std::string& instance);

  // afd_frontend_ffn_* series (Prometheus text).
  std::string render_metrics() const;

 private:
  struct Member {
    std::string address, name;
  };
  struct WorkerState {
    uint64_t change = 0;   // the change it holds (0: none given)
    std::string instance;  // the process that got it (its /health instance when it did)
    std::string seen;      // its /health instance as last seen by reconcile()
    uint64_t pushes = 0;   // whole lists given by reconcile()
  };
  std::string members_list_json() const;  // mu_ held: {"members": [...]}
  bool current(size_t i) const;           // mu_ held: worker i holds the last change
  WorkerState& state(size_t i);           // mu_ held: worker i's (state_ grows with the roster)
  std::pair<int, std::string> post(const std::string& body);
  std::pair<int, std::string> get();
  // POST/GET to worker w's /admin/ffn: its answer, or why none came.
  Result<std::pair<int, std::string>> call(const FrontendWorker& w, const char* method, const std::string& body) const;

  const WorkerRoster* workers_;
  int timeout_ms_;
  std::mutex change_mu_;  // held while a change or a reconciliation talks to workers
  mutable std::mutex mu_;
  std::vector<Member> members_;     // the membership set through request(); empty: none yet
  uint64_t changes_ = 0;            // changes applied (the current one's number)
  uint64_t refused_ = 0;            // changes refused (no worker up, or refused by the first)
  mutable std::vector<WorkerState> state_;  // by worker index (grown on first use of an index)
  std::string api_key_;
};

}  // namespace afd::serve
