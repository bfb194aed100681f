// Service: assembles the serving stack for one model: tokenizer and chat template from
// the model directory, one Scheduler per Engine (data-parallel attention workers), the
// Router, Metrics, and the HTTP API (ApiServer) over them (LocalBackend). Used by
// `afd serve` and by the integration tests (which pass fake engines).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/speculative.h"
#include "serve/api/api_server.h"
#include "serve/metrics/metrics.h"
#include "serve/scheduling/local_backend.h"
#include "serve/scheduling/router.h"
#include "serve/scheduling/scheduler.h"

namespace afd::serve {

struct ServiceOptions {
  ServerOptions server;
  SchedulerOptions scheduler;
  std::string model_dir;   // holds tokenizer.json and (optionally) tokenizer_config.json
  std::string model_name;  // served model id; empty: the directory's last component
  int64_t max_context = 0; // 0: the model's max_position_embeddings
  AdminFn ffn_admin;       // GET/POST /admin/ffn (LocalBackend::set_ffn_admin); empty: 404
  // The engines' numerics identity (ModelServing::system_fingerprint, ::deterministic).
  std::string system_fingerprint;
  bool deterministic = false;
};

class Service {
 public:
  // engines: at least one; all must serve the same model. drafters: empty (no speculative
  // decoding) or one per engine (null entries allowed), used with opt.scheduler.draft_tokens.
  static Result<std::unique_ptr<Service>> create(const ServiceOptions& opt, std::vector<std::unique_ptr<Engine>> engines,
                                                 std::vector<std::unique_ptr<Drafter>> drafters = {});
  ~Service();
  // Binds the socket and starts the scheduler threads; port() is valid afterwards.
  Status start();
  int port() const { return api_->port(); }
  // Serves until stop() is called from another thread.
  Status run();
  void stop();
  // Graceful shutdown: drain() stops taking requests (503, /health 503 "draining"); drained()
  // is true once every request accepted before has finished. Both thread-safe; stop() after.
  void drain() { backend_->drain(); }
  bool drained() const { return backend_->drained(); }
  Metrics& metrics() { return *metrics_; }
  const ModelServing& model() const { return model_; }

 private:
  Service() = default;
  ModelServing model_;  // before the backend and the API, which refer to it
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::unique_ptr<Drafter>> drafters_;  // [engines] or empty
  std::unique_ptr<Metrics> metrics_;
  std::vector<std::unique_ptr<Scheduler>> schedulers_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<LocalBackend> backend_;
  std::unique_ptr<ApiServer> api_;  // last: destroyed (its handlers finished) first
};

}  // namespace afd::serve
