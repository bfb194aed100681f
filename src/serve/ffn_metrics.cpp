#include "serve/ffn_metrics.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>

#include "serve/metrics.h"

namespace afd::serve {

std::string render_ffn_worker_metrics(const FfnWorkerStats& s, const FfnWorkerInfo& info, int64_t now_ns) {
  std::string o;
  auto counter = [&](const char* name, const char* help, double v) {
    prom_header(&o, name, "counter", help);
    o += std::string(name) + " " + prom_num(v) + "\n";
  };
  prom_header(&o, "afd_ffn_worker_info", "gauge", "This FFN worker: expert shard, TP degree, device, model fingerprint.");
  o += "afd_ffn_worker_info{shard=\"" + std::to_string(info.shard) + "\",n_shards=\"" + std::to_string(info.n_shards) +
       "\",tp=\"" + std::to_string(info.tp) + "\",device=\"" + info.device + "\",model=\"" + info.model + "\"} 1\n";
  prom_header(&o, "afd_ffn_attention_workers", "gauge",
              "Attention workers this FFN worker serves (handshake accepted) and expects (x of xAyF).");
  o += "afd_ffn_attention_workers{state=\"serving\"} " + std::to_string(s.attention_serving.load()) + "\n";
  o += "afd_ffn_attention_workers{state=\"expected\"} " + std::to_string(info.n_attention) + "\n";
  const int64_t batches = s.batches.load();
  const int64_t tokens = s.tokens.load();
  const double compute_s = static_cast<double>(s.ffn_ns.load()) * 1e-9;
  counter("afd_ffn_batches_total", "Aggregated batches computed (one per layer and micro-batch step).",
          static_cast<double>(batches));
  counter("afd_ffn_frames_total", "Attention-to-FFN frames served.", static_cast<double>(s.frames.load()));
  counter("afd_ffn_tokens_total", "Tokens computed (rate: this worker's tokens/s).", static_cast<double>(tokens));
  counter("afd_ffn_multi_worker_batches_total", "Batches that aggregated frames of more than one attention worker.",
          static_cast<double>(s.multi_peer_batches.load()));
  counter("afd_ffn_compute_seconds_total", "Seconds spent computing the FFN (experts, shared expert, dense layers).",
          compute_s);
  counter("afd_ffn_bad_frames_total", "Malformed frames, answered with an error frame.",
          static_cast<double>(s.bad_frames.load()));
  counter("afd_ffn_refused_handshakes_total", "Attention workers refused at the handshake (model or topology mismatch).",
          static_cast<double>(s.refused.load()));
  counter("afd_ffn_peer_losses_total", "Served attention workers lost (disconnected or replaced).",
          static_cast<double>(s.peer_losses.load()));
  counter("afd_ffn_late_peers_total",
          "Expected frames that did not come within the peer timeout (the batch was served without them).",
          static_cast<double>(s.late_peers.load()));
  prom_header(&o, "afd_ffn_batch_tokens", "histogram", "Tokens per aggregated batch.");
  int64_t acc = 0;
  for (int b = 0; b < FfnWorkerStats::kTokenBuckets; ++b) {
    acc += s.batch_tokens[b].load();
    const std::string le = b + 1 < FfnWorkerStats::kTokenBuckets ? std::to_string(int64_t{1} << b) : "+Inf";
    o += "afd_ffn_batch_tokens_bucket{le=\"" + le + "\"} " + std::to_string(acc) + "\n";
  }
  // Sum and count from the same counters as the buckets, read separately: under load they
  // may be a batch apart.
  o += "afd_ffn_batch_tokens_sum " + std::to_string(tokens) + "\nafd_ffn_batch_tokens_count " +
       std::to_string(batches) + "\n";
  const int64_t started = s.started_ns.load();
  const double up_s = started > 0 && now_ns > started ? static_cast<double>(now_ns - started) * 1e-9 : 0.0;
  prom_header(&o, "afd_ffn_uptime_seconds", "gauge", "Seconds since the worker began serving.");
  o += "afd_ffn_uptime_seconds " + prom_num(up_s) + "\n";
  prom_header(&o, "afd_ffn_idle_ratio", "gauge",
              "1 - compute seconds / uptime: the FFN idle ratio (eta_F) over the whole run so far.");
  o += "afd_ffn_idle_ratio " + prom_num(up_s > 0 ? std::max(0.0, 1.0 - compute_s / up_s) : 1.0) + "\n";
  return o;
}

Result<std::unique_ptr<StatusServer>> StatusServer::start(ServerOptions o, MetricsFn metrics, HealthFn health) {
  std::unique_ptr<StatusServer> srv(new StatusServer());
  srv->svr_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *srv->svr_;
  configure_server(s, o, "status server", [] {});
  s.Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  s.Get("/health", [health](const httplib::Request&, httplib::Response& res) {
    auto [code, body] = health();
    res.status = code;
    res.set_content(body, "application/json");
  });
  AFD_ASSIGN_OR_RETURN(srv->port_, bind_server(s, o));
  srv->thread_ = std::thread([&s] { s.listen_after_bind(); });
  // stop() is a no-op until the listening loop runs: wait for it, so the destructor
  // cannot miss it (and hang joining).
  for (int i = 0; i < 2000 && !s.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!s.is_running()) return io_error("status server on " + o.host + ":" + std::to_string(srv->port_) + " did not start");
  return srv;
}

StatusServer::~StatusServer() {
  if (svr_) svr_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace afd::serve
