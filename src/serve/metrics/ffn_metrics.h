// Observability of an FFN worker process (`afd worker --role ffn --metrics-listen HOST:PORT`):
// its FfnWorkerStats as Prometheus text, and a small HTTP server answering GET /metrics and
// GET /health for processes that serve no API of their own.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "core/status.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/afd/ffn_worker.h"
#include "serve/api/http_common.h"

namespace afd::serve {

namespace http {
class Server;
}

// What names one FFN worker in the series: every afd_ffn_* sample carries ffn="<id>" (the
// shard index when id is empty); afd_ffn_worker_info carries the rest.
struct FfnWorkerInfo {
  std::string id;       // distinguishes workers rendered together (several bundles in one process)
  int shard = 0;        // i of --shard i/y
  int n_shards = 1;     // y
  int tp = 1;           // FFN TP degree
  int n_attention = 1;  // attention workers expected (x)
  std::string device = "cpu";
  std::string model;    // model fingerprint (hex), as in the handshake
};

struct FfnWorkerSample {
  const FfnWorkerStats* stats = nullptr;  // must stay valid while rendering
  FfnWorkerInfo info;
};

// A worker's sample: its stats, shard, TP degree, device and expected attention workers from
// its options, the model fingerprint from its handshake; `id` as FfnWorkerInfo::id.
FfnWorkerSample ffn_worker_sample(const FfnWorker& w, std::string id = "");

// Prometheus text of FFN workers' counters at `now_ns` (now_ns() clock), each family once with
// one sample per worker: batches, frames, tokens, compute seconds, aggregated batch sizes
// (histogram), attention workers served / expected, faults (bad frames, refused handshakes,
// lost and late peers), uptime and the idle ratio since the worker started serving
// (1 - compute / uptime: eta_F of the A/F ratio paper, eq. (23) over the whole run; windowed:
// 1 - rate(afd_ffn_compute_seconds_total)). Used by FFN worker processes and, for in-process
// bundles, appended to the service's /metrics.
std::string render_ffn_worker_metrics(std::span<const FfnWorkerSample> workers, int64_t now_ns);

// An attention engine's FFN membership (FfnClient::membership()); `labels` (Prometheus
// label pairs, e.g. worker="0",engine="1") name it in every sample.
struct FfnMembershipSample {
  std::string labels;
  FfnMembership membership;
};
// Prometheus text of the attention engines' FFN memberships: the assignment epoch, FFN
// workers in it (live), takeovers / rejoins / other leaves so far, and per member whether it
// is assigned and how long it has been unreachable.
std::string render_ffn_membership_metrics(std::span<const FfnMembershipSample> engines);

// GET /metrics -> metrics() as text/plain (Prometheus 0.0.4); GET /health -> health()'s
// status code and JSON body. Anything else: 404 with an OpenAI-style error body. Runs on
// its own threads from start() until the object is destroyed.
class StatusServer {
 public:
  using MetricsFn = std::function<std::string()>;
  using HealthFn = std::function<std::pair<int, std::string>()>;
  // Binds o.host:o.port (0: any free port); io_error naming the address when it cannot.
  static Result<std::unique_ptr<StatusServer>> start(ServerOptions o, MetricsFn metrics, HealthFn health);
  ~StatusServer();
  int port() const { return port_; }

 private:
  StatusServer() = default;
  std::unique_ptr<http::Server> svr_;  // run by thread_
  std::thread thread_;
  int port_ = -1;
};

}  // namespace afd::serve
