// Frontend: the public OpenAI-compatible API of a multi-process AFD deployment, running no
// engine. Each attention worker is an `afd worker --role attention` process (a full
// Service: scheduler + engine + sampling) with its own internal HTTP address. Per request the
// front end parses and tokenizes the body exactly as a worker would (to answer 4xx itself
// and to place it), picks a worker with the Router (in-flight token load + prefix), and runs
// the request there as an internal stream (serve/frontend/proxy_session.h): it renders the client's
// answer (SSE chunks as tokens arrive, or one JSON body) itself and, when the worker dies or
// stalls mid-request, continues the request on another worker without the client noticing.
// A worker that refuses the connection or answers 503 is marked down and the request is
// placed again on another one; with none left the answer is 503 + Retry-After.
// A background thread polls every worker's GET /health (logging what it is waiting for).
// A client that disconnects closes the upstream connection, which cancels the sequence on
// the worker. The API key, if set, is checked here (workers run without one and must only
// be reachable from the front end). GET/POST /admin/ffn (protected like /v1/*) changes the FFN
// membership of every attention worker at once, and keeps it for workers that restart
// (serve/frontend/frontend_ffn_admin.h); GET/POST /admin/attention adds and removes attention
// workers while it runs (serve/frontend/frontend_attention_admin.h); with a topology file,
// POST /admin/reload (and reload(), which afd serve calls on SIGHUP) re-reads it
// (serve/frontend/frontend_reload.h). The routes are the HTTP API's (serve/api/api_server.h);
// Frontend is its remote GenerationBackend, adding the /admin/attention and /admin/reload routes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "serve/api/api_server.h"
#include "serve/api/generation_backend.h"
#include "serve/frontend/frontend_attention_admin.h"
#include "serve/frontend/frontend_ffn_admin.h"
#include "serve/frontend/frontend_reload.h"
#include "serve/api/model_serving.h"
#include "serve/metrics/metrics_federation.h"
#include "serve/frontend/proxy_client.h"
#include "serve/frontend/proxy_session.h"
#include "serve/scheduling/router.h"
#include "serve/frontend/upstream_worker.h"

namespace afd::serve {

struct FrontendOptions {
  ServerOptions server;              // host, port, api_key, http_threads, retry_after_s, limits
  std::vector<std::string> workers;  // host:port of the attention workers at start, by index
  // The topology file the workers came from (afd serve --topology-file): POST /admin/reload
  // and reload() re-read it. Empty: no reload (404).
  std::string topology_file;
  std::string model_dir;             // tokenizer.json, tokenizer_config.json, config.json
  std::string model_name;            // empty: the directory's name (as the workers default to)
  int64_t max_context = 0;           // 0: the model's
  int health_interval_ms = 500;
  int health_timeout_ms = 1000;
  // Upstream deadlines and failover (serve/frontend/proxy_session.h): idle_timeout_s
  // (--upstream-idle-timeout-s), failover_timeout_s (--failover-timeout-s), exact_replay
  // (--failover-replay), connect and write limits. retry_after_s is taken from server.
  ProxyPolicy proxy;
  // GET /metrics also carries every attention worker's own series (label attention="<index>")
  // and those of these targets (e.g. the FFN workers' --metrics-listen), fetched per scrape
  // within health_timeout_ms (serve/metrics/metrics_federation.h). federate = false: front end only.
  bool federate = true;
  std::vector<MetricsTarget> metrics_targets;
  // Appended to the front end's own /metrics (e.g. the launcher's worker restarts); must
  // not repeat a family the front end renders.
  std::function<std::string()> extra_metrics;
  // Worker processes that are down for good ("" while none is; e.g. a launcher's child whose
  // restarts are exhausted): non-empty makes /health 503 with it, and it leads every
  // list of reasons (why_workers_down). Thread-safe; called per /health and per 503.
  std::function<std::string()> lost_workers;
  // Called once (from the health thread, with the bound port) when every worker has answered /health.
  std::function<void(int port)> on_all_up;
};

class Frontend final : public GenerationBackend {
 public:
  static Result<std::unique_ptr<Frontend>> create(FrontendOptions opt);
  ~Frontend();
  // Binds the socket and starts the health thread; port() is valid afterwards.
  Status start();
  int port() const { return port_; }
  // Serves until stop() is called from another thread.
  Status run();
  void stop();
  // Graceful shutdown: drain() stops taking requests (503 + Retry-After, /health 503
  // "draining"); drained() is true once no request is being proxied or streamed back.
  // Both thread-safe; stop() after.
  void drain() { draining_ = true; }
  bool drained() const { return active_.load() == 0; }
  int workers_up() const;
  // "worker 0: <why>; worker 1: <why>" over the workers that are down, after "lost for good:
  // <lost_workers>" if that is not empty; "" if none of them. No <why> is empty. attempts
  // (by worker index; may be null): why a request's tries failed, used over why_down() for
  // those workers (one may be up again by the time a request gives up).
  std::string why_workers_down(const std::vector<std::string>* attempts = nullptr) const;
  const ModelServing& model() const { return model_; }
  // Re-reads opt.topology_file and applies its worker lists (serve/frontend/frontend_reload.h): HTTP
  // status and JSON body as POST /admin/reload answers. Thread-safe.
  std::pair<int, std::string> reload(const std::string& origin);
  // The front end's own afd_frontend_* series.
  std::string render_metrics() const;
  // What GET /metrics answers: render_metrics() and, with federate, the workers' series.
  std::string scrape_metrics() const;
  // Replaces FrontendOptions::metrics_targets (e.g. as FFN workers are added and removed). Thread-safe.
  void set_metrics_targets(std::vector<MetricsTarget> targets);
  // The membership operations behind /admin/attention, for a launcher that adds and removes
  // the attention workers it starts (valid after create(); thread-safe).
  AttentionAdmin& attention_admin() { return *attention_admin_; }

  // GenerationBackend (what the HTTP API asks of the front end).
  bool stopping() const override { return stopping_.load(); }
  bool draining() const override { return draining_.load(); }
  std::atomic<int>& in_flight() override { return active_; }
  void count_response(int status) override;
  Readiness readiness() const override;
  std::string metrics_text() const override { return scrape_metrics(); }
  std::optional<AdminAnswer> admin_ffn(const std::string& method, const std::string& body) override;
  bool serves_internal_streams() const override { return false; }
  void generate(GenerationCall& call, const http::Request& req, http::Response& res) override;
  void extra_routes(http::Server& s) override;  // /admin/attention, /admin/reload

 private:
  Frontend() = default;
  void health_loop();
  WorkerList listed_workers() const;  // the attention workers not removed, by index

  FrontendOptions opt_;
  ModelServing model_;
  std::unique_ptr<WorkerRoster> workers_;  // by index; grows through attention_admin_
  std::unique_ptr<Router> router_;
  std::unique_ptr<FfnFanout> ffn_admin_;  // GET/POST /admin/ffn; the health thread reconciles
  std::unique_ptr<AttentionAdmin> attention_admin_;  // GET/POST /admin/attention; the health thread settles
  std::unique_ptr<TopologyReload> reload_;           // null without opt_.topology_file
  mutable std::mutex targets_mu_;                    // guards opt_.metrics_targets
  int port_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};
  // Generation handlers running, plus SSE answers still streaming after their handler
  // returned (raised before the draining check, so drained() cannot miss one).
  std::atomic<int> active_{0};

  std::thread health_;
  std::mutex health_mu_;
  std::condition_variable health_cv_;

  mutable std::mutex counts_mu_;
  std::map<int, uint64_t> responses_;  // by HTTP status
  ProxyCounters counters_;
  ProxyPool pool_;  // what the sessions share (workers_, router_, counters_)

  std::mutex sessions_mu_;
  std::vector<std::weak_ptr<ProxySession>> sessions_;  // requests in flight, cancelled by stop()

  // The HTTP API over this backend; last, so that it (and its handlers) ends first.
  std::unique_ptr<ApiServer> api_;
};

}  // namespace afd::serve
