#include "serve/metrics/ffn_metrics.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "serve/http/server.h"
#include "serve/metrics/metrics.h"

namespace afd::serve {

FfnWorkerSample ffn_worker_sample(const FfnWorker& w, std::string id) {
  FfnWorkerSample s;
  s.stats = &w.stats();
  const FfnWorkerOptions& o = w.options();
  s.info.id = std::move(id);
  s.info.shard = o.index;
  s.info.n_shards = o.n_ffn;
  s.info.tp = o.tp;
  s.info.n_attention = o.n_attention;
  s.info.device = o.device;
  char fp[17];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(w.handshake().fingerprint));
  s.info.model = fp;
  return s;
}

std::string render_ffn_worker_metrics(std::span<const FfnWorkerSample> workers, int64_t now_ns) {
  std::string o;
  auto id = [](const FfnWorkerInfo& i) { return "ffn=\"" + (i.id.empty() ? std::to_string(i.shard) : i.id) + "\""; };
  // One family: HELP/TYPE once, then `value(sample)` for every worker under its label.
  auto family = [&](const char* name, const char* type, const char* help,
                    const std::function<double(const FfnWorkerStats&)>& value) {
    prom_header(&o, name, type, help);
    for (const FfnWorkerSample& w : workers)
      o += std::string(name) + "{" + id(w.info) + "} " + prom_num(value(*w.stats)) + "\n";
  };
  auto as_d = [](int64_t v) { return static_cast<double>(v); };
  prom_header(&o, "afd_ffn_worker_info", "gauge", "This FFN worker: expert shard, TP degree, device, model fingerprint.");
  for (const FfnWorkerSample& w : workers) {
    const FfnWorkerInfo& i = w.info;
    o += "afd_ffn_worker_info{" + id(i) + ",shard=\"" + std::to_string(i.shard) + "\",n_shards=\"" +
         std::to_string(i.n_shards) + "\",tp=\"" + std::to_string(i.tp) + "\",device=\"" + i.device + "\",model=\"" +
         i.model + "\"} 1\n";
  }
  prom_header(&o, "afd_ffn_attention_workers", "gauge",
              "Attention workers this FFN worker serves (handshake accepted) and expects (x of xAyF).");
  for (const FfnWorkerSample& w : workers) {
    o += "afd_ffn_attention_workers{" + id(w.info) + ",state=\"serving\"} " +
         std::to_string(w.stats->attention_serving.load()) + "\n";
    o += "afd_ffn_attention_workers{" + id(w.info) + ",state=\"expected\"} " + std::to_string(w.info.n_attention) + "\n";
  }
  family("afd_ffn_batches_total", "counter", "Aggregated batches computed (one per layer and micro-batch step).",
         [&](const FfnWorkerStats& s) { return as_d(s.batches.load()); });
  family("afd_ffn_frames_total", "counter", "Attention-to-FFN frames served.",
         [&](const FfnWorkerStats& s) { return as_d(s.frames.load()); });
  family("afd_ffn_tokens_total", "counter", "Tokens computed (rate: this worker's tokens/s).",
         [&](const FfnWorkerStats& s) { return as_d(s.tokens.load()); });
  family("afd_ffn_expert_rows_total", "counter",
         "(token, routed expert) pairs computed: this worker's share of the expert-parallel load.",
         [&](const FfnWorkerStats& s) { return as_d(s.expert_rows.load()); });
  family("afd_ffn_multi_worker_batches_total", "counter",
         "Batches that aggregated frames of more than one attention worker.",
         [&](const FfnWorkerStats& s) { return as_d(s.multi_peer_batches.load()); });
  family("afd_ffn_compute_seconds_total", "counter",
         "Seconds spent computing the FFN (experts, shared expert, dense layers).",
         [&](const FfnWorkerStats& s) { return as_d(s.ffn_ns.load()) * 1e-9; });
  family("afd_ffn_bad_frames_total", "counter", "Malformed frames, answered with an error frame.",
         [&](const FfnWorkerStats& s) { return as_d(s.bad_frames.load()); });
  family("afd_ffn_refused_handshakes_total", "counter",
         "Attention workers refused at the handshake (model or topology mismatch).",
         [&](const FfnWorkerStats& s) { return as_d(s.refused.load()); });
  family("afd_ffn_peer_losses_total", "counter", "Served attention workers lost (disconnected or replaced).",
         [&](const FfnWorkerStats& s) { return as_d(s.peer_losses.load()); });
  family("afd_ffn_late_peers_total", "counter",
         "Expected frames that did not come within the peer timeout (the batch was served without them).",
         [&](const FfnWorkerStats& s) { return as_d(s.late_peers.load()); });
  family("afd_ffn_probes_total", "counter", "Liveness pings from attention workers answered.",
         [&](const FfnWorkerStats& s) { return as_d(s.probes.load()); });
  family("afd_ffn_reassignments_total", "counter",
         "Handshakes that changed an attention worker's expert assignment (takeovers, rebalances).",
         [&](const FfnWorkerStats& s) { return as_d(s.reassignments.load()); });
  family("afd_ffn_stale_frames_total", "counter",
         "Frames built for another assignment epoch than the attention worker's current one (answered with an error).",
         [&](const FfnWorkerStats& s) { return as_d(s.stale_frames.load()); });
  family("afd_ffn_held_experts", "gauge",
         "Routed experts this worker holds for the attention worker that last said hello.",
         [&](const FfnWorkerStats& s) { return as_d(s.held_experts.load()); });
  prom_header(&o, "afd_ffn_routed_experts", "gauge",
              "Routed experts per MoE layer of the model: the expert ids of afd_ffn_expert_tokens_total are below it.");
  for (const FfnWorkerSample& w : workers)
    if (w.stats->n_experts > 0)
      o += "afd_ffn_routed_experts{" + id(w.info) + "} " + std::to_string(w.stats->n_experts) + "\n";
  prom_header(&o, "afd_ffn_expert_tokens_total", "counter",
              "Tokens routed to each (layer, routed expert) that this worker computed (TP: rank 0 only); pairs "
              "without any are left out. The input of afd plan eplb --counts.");
  for (const FfnWorkerSample& w : workers) {
    const FfnWorkerStats& s = *w.stats;
    for (int64_t l = 0; l < s.n_layers && s.n_experts > 0; ++l)
      for (int64_t e = 0; e < s.n_experts; ++e)
        if (const int64_t v = s.expert_tokens_at(l, e); v > 0)
          o += "afd_ffn_expert_tokens_total{" + id(w.info) + ",layer=\"" + std::to_string(l) + "\",expert=\"" +
               std::to_string(e) + "\"} " + std::to_string(v) + "\n";
  }
  prom_header(&o, "afd_ffn_batch_tokens", "histogram", "Tokens per aggregated batch.");
  for (const FfnWorkerSample& w : workers) {
    const FfnWorkerStats& s = *w.stats;
    int64_t acc = 0;
    for (int b = 0; b < FfnWorkerStats::kTokenBuckets; ++b) {
      acc += s.batch_tokens[b].load();
      const std::string le = b + 1 < FfnWorkerStats::kTokenBuckets ? std::to_string(int64_t{1} << b) : "+Inf";
      o += "afd_ffn_batch_tokens_bucket{" + id(w.info) + ",le=\"" + le + "\"} " + std::to_string(acc) + "\n";
    }
    // _count is the +Inf bucket (as the format requires, whatever batches finish meanwhile);
    // _sum is the tokens counter, read after the buckets: under load it may include a batch
    // the buckets do not yet.
    o += "afd_ffn_batch_tokens_sum{" + id(w.info) + "} " + std::to_string(s.tokens.load()) + "\n";
    o += "afd_ffn_batch_tokens_count{" + id(w.info) + "} " + std::to_string(acc) + "\n";
  }
  auto uptime = [now_ns](const FfnWorkerStats& s) {
    const int64_t started = s.started_ns.load();
    return started > 0 && now_ns > started ? static_cast<double>(now_ns - started) * 1e-9 : 0.0;
  };
  family("afd_ffn_uptime_seconds", "gauge", "Seconds since the worker began serving.", uptime);
  family("afd_ffn_idle_ratio", "gauge",
         "1 - compute seconds / uptime: the FFN idle ratio (eta_F) over the whole run so far.",
         [&](const FfnWorkerStats& s) {
           const double up = uptime(s);
           return up > 0 ? std::max(0.0, 1.0 - as_d(s.ffn_ns.load()) * 1e-9 / up) : 1.0;
         });
  return o;
}

namespace {
// A Prometheus label value: backslash, double quote and newline escaped (member names come
// from the peers).
std::string label_value(const std::string& v) {
  std::string r;
  for (char c : v) {
    if (c == '\\' || c == '"') r += '\\';
    if (c == '\n') {
      r += "\\n";
      continue;
    }
    r += c;
  }
  return r;
}
}  // namespace

std::string render_ffn_membership_metrics(std::span<const FfnMembershipSample> engines) {
  std::string o;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    prom_header(&o, name, type, help);
    for (const FfnMembershipSample& e : engines)
      o += std::string(name) + "{" + e.labels + "} " + prom_num(static_cast<double>(value(e.membership))) + "\n";
  };
  family("afd_ffn_epoch", "gauge",
         "FFN expert assignment epoch (0: the FFN workers hold the shards they were started with; each takeover, "
         "rejoin or membership change starts the next).",
         [](const FfnMembership& m) { return m.epoch; });
  family("afd_ffn_live_workers", "gauge", "FFN workers holding experts in the current assignment.",
         [](const FfnMembership& m) { return m.assigned; });
  family("afd_ffn_takeovers_total", "counter",
         "FFN workers whose experts the others took over after --ffn-takeover-s unreachable.",
         [](const FfnMembership& m) { return m.takeovers; });
  family("afd_ffn_rejoins_total", "counter", "FFN workers that joined the assignment (back after a loss, or added).",
         [](const FfnMembership& m) { return m.rejoins; });
  family("afd_ffn_leaves_total", "counter",
         "FFN workers that left the assignment otherwise (removed from the membership, refused their assignment).",
         [](const FfnMembership& m) { return m.leaves; });
  bool placement = false;
  for (const FfnMembershipSample& e : engines) placement = placement || e.membership.expert_placement;
  if (placement) {
    family("afd_ffn_eplb_placements_total", "counter",
           "Expert placements planned by EPLB and put in effect (--eplb).",
           [](const FfnMembership& m) { return m.placements; });
    prom_header(&o, "afd_ffn_eplb_predicted_max_over_mean", "gauge",
                "Predicted max/mean FFN worker load (pairs) over the last planning window: of the placement in "
                "effect and of the contiguous one (1 before the first plan).");
    for (const FfnMembershipSample& e : engines) {
      o += "afd_ffn_eplb_predicted_max_over_mean{" + e.labels + ",placement=\"eplb\"} " +
           prom_num(e.membership.placement_planned) + "\n";
      o += "afd_ffn_eplb_predicted_max_over_mean{" + e.labels + ",placement=\"contiguous\"} " +
           prom_num(e.membership.placement_contiguous) + "\n";
    }
  }
  auto label = [](const FfnMembershipSample& e, const FfnMembership::Member& x) {
    return e.labels + ",member=\"" + label_value(x.name) + "\",address=\"" + label_value(x.address) + "\"";
  };
  prom_header(&o, "afd_ffn_member_assigned", "gauge", "1 if this FFN worker holds experts in the current assignment.");
  for (const FfnMembershipSample& e : engines)
    for (const auto& x : e.membership.members)
      if (!x.removed) o += "afd_ffn_member_assigned{" + label(e, x) + "} " + (x.assigned ? "1" : "0") + "\n";
  prom_header(&o, "afd_ffn_member_unreachable_seconds", "gauge",
              "How long this FFN worker has been unreachable (0: reachable).");
  for (const FfnMembershipSample& e : engines)
    for (const auto& x : e.membership.members)
      if (!x.removed)
        o += "afd_ffn_member_unreachable_seconds{" + label(e, x) + "} " +
             prom_num(static_cast<double>(x.unreachable_ms) * 1e-3) + "\n";
  return o;
}

Result<std::unique_ptr<StatusServer>> StatusServer::start(ServerOptions o, MetricsFn metrics, HealthFn health) {
  std::unique_ptr<StatusServer> srv(new StatusServer());
  srv->svr_ = std::make_unique<http::Server>(http_options(o, "status server"));
  http::Server& s = *srv->svr_;
  configure_server(s, o, "status server", [] {});
  s.get("/metrics", [metrics](const http::Request&, http::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  s.get("/health", [health](const http::Request&, http::Response& res) {
    auto [code, body] = health();
    res.status = code;
    res.set_content(body, "application/json");
  });
  // Bound means listening: connections queue from here on, served once the thread runs.
  AFD_ASSIGN_OR_RETURN(srv->port_, bind_server(s, o));
  srv->thread_ = std::thread([&s] { (void)s.run(); });
  return srv;
}

StatusServer::~StatusServer() {
  if (svr_) svr_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace afd::serve
