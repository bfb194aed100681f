// An FFN worker process's observability: its stats as Prometheus text, and the status
// server that answers /metrics and /health (afd worker --role ffn --metrics-listen).
#include <gtest/gtest.h>

#include "../http_test_client.h"
#include "serve/metrics/ffn_metrics.h"

namespace afd::serve::test_ffn_metrics {
namespace {

TEST(FfnMetrics, PrometheusTextCarriesTheWorkersCounters) {
  FfnWorkerStats s;
  s.batches = 5;
  s.frames = 7;
  s.tokens = 70;
  s.expert_rows = 140;
  s.multi_peer_batches = 2;
  s.ffn_ns = 500000000;  // 0.5 s of compute
  s.started_ns = 1000000000;
  s.attention_serving = 2;
  s.peer_losses = 1;
  s.late_peers = 3;
  s.probes = 11;
  s.bad_frames = 4;
  s.refused = 6;
  // Batches of 1, 3, 3, 20 and 10000 tokens.
  for (int64_t n : {1, 3, 3, 20, 10000}) s.batch_tokens[FfnWorkerStats::token_bucket(n)]++;
  FfnWorkerSample one;
  one.stats = &s;
  one.info.shard = 1;
  one.info.n_shards = 2;
  one.info.n_attention = 3;
  one.info.model = "00ff";
  // 2 layers x 3 experts: layer 1 saw expert 0 twice and expert 2 once.
  s.n_layers = 2;
  s.n_experts = 3;
  s.expert_tokens = std::make_unique<std::atomic<int64_t>[]>(6);
  s.expert_tokens[3] = 2;
  s.expert_tokens[5] = 1;
  const std::string t = render_ffn_worker_metrics({&one, 1}, /*now_ns=*/3000000000);  // 2 s after the start
  EXPECT_EQ(t.find("afd_ffn_expert_tokens_total{ffn=\"1\",layer=\"0\""), std::string::npos) << t;  // zeros left out
  for (const char* want :
       {"afd_ffn_worker_info{ffn=\"1\",shard=\"1\",n_shards=\"2\",tp=\"1\",device=\"cpu\",model=\"00ff\"} 1",
        "afd_ffn_attention_workers{ffn=\"1\",state=\"serving\"} 2\n",
        "afd_ffn_attention_workers{ffn=\"1\",state=\"expected\"} 3\n", "afd_ffn_batches_total{ffn=\"1\"} 5\n",
        "afd_ffn_frames_total{ffn=\"1\"} 7\n", "afd_ffn_tokens_total{ffn=\"1\"} 70\n",
        "afd_ffn_expert_rows_total{ffn=\"1\"} 140\n",
        "afd_ffn_multi_worker_batches_total{ffn=\"1\"} 2\n", "afd_ffn_compute_seconds_total{ffn=\"1\"} 0.5\n",
        "afd_ffn_bad_frames_total{ffn=\"1\"} 4\n", "afd_ffn_refused_handshakes_total{ffn=\"1\"} 6\n",
        "afd_ffn_peer_losses_total{ffn=\"1\"} 1\n", "afd_ffn_late_peers_total{ffn=\"1\"} 3\n",
        "afd_ffn_probes_total{ffn=\"1\"} 11\n", "afd_ffn_routed_experts{ffn=\"1\"} 3\n",
        "afd_ffn_expert_tokens_total{ffn=\"1\",layer=\"1\",expert=\"0\"} 2\n",
        "afd_ffn_expert_tokens_total{ffn=\"1\",layer=\"1\",expert=\"2\"} 1\n",
        "# TYPE afd_ffn_batch_tokens histogram\n",
        // Cumulative buckets: <=1: 1; <=2: 1; <=4: 3; <=16: 3; <=32: 4; <=8192: 4; +Inf: 5.
        "afd_ffn_batch_tokens_bucket{ffn=\"1\",le=\"1\"} 1\n", "afd_ffn_batch_tokens_bucket{ffn=\"1\",le=\"2\"} 1\n",
        "afd_ffn_batch_tokens_bucket{ffn=\"1\",le=\"4\"} 3\n", "afd_ffn_batch_tokens_bucket{ffn=\"1\",le=\"16\"} 3\n",
        "afd_ffn_batch_tokens_bucket{ffn=\"1\",le=\"32\"} 4\n", "afd_ffn_batch_tokens_bucket{ffn=\"1\",le=\"8192\"} 4\n",
        "afd_ffn_batch_tokens_bucket{ffn=\"1\",le=\"+Inf\"} 5\n", "afd_ffn_batch_tokens_count{ffn=\"1\"} 5\n",
        "afd_ffn_uptime_seconds{ffn=\"1\"} 2\n", "afd_ffn_idle_ratio{ffn=\"1\"} 0.75\n"})
    EXPECT_NE(t.find(want), std::string::npos) << want << "\n" << t;
  // Two workers (one not started yet: no uptime, fully idle), each family's HELP once.
  FfnWorkerStats fresh;
  FfnWorkerSample two[2] = {one, {&fresh, {}}};
  two[1].info.id = "0.7";
  const std::string t2 = render_ffn_worker_metrics(two, 5);
  EXPECT_NE(t2.find("afd_ffn_uptime_seconds{ffn=\"0.7\"} 0\n"), std::string::npos) << t2;
  EXPECT_NE(t2.find("afd_ffn_idle_ratio{ffn=\"0.7\"} 1\n"), std::string::npos) << t2;
  EXPECT_NE(t2.find("afd_ffn_tokens_total{ffn=\"1\"} 70\n"), std::string::npos) << t2;
  size_t helps = 0;
  for (size_t at = 0; (at = t2.find("# HELP afd_ffn_tokens_total ", at)) != std::string::npos; ++at) ++helps;
  EXPECT_EQ(helps, 1u);
}

TEST(FfnMetrics, TokenBucketsArePowersOfTwo) {
  EXPECT_EQ(FfnWorkerStats::token_bucket(0), 0);
  EXPECT_EQ(FfnWorkerStats::token_bucket(1), 0);
  EXPECT_EQ(FfnWorkerStats::token_bucket(2), 1);
  EXPECT_EQ(FfnWorkerStats::token_bucket(3), 2);
  EXPECT_EQ(FfnWorkerStats::token_bucket(4), 2);
  EXPECT_EQ(FfnWorkerStats::token_bucket(8192), 13);
  EXPECT_EQ(FfnWorkerStats::token_bucket(8193), FfnWorkerStats::kTokenBuckets - 1);
  EXPECT_EQ(FfnWorkerStats::token_bucket(int64_t{1} << 40), FfnWorkerStats::kTokenBuckets - 1);
}

TEST(StatusServer, AnswersMetricsAndHealthAndStops) {
  ServerOptions o;
  o.port = 0;
  o.http_threads = 2;
  int scrapes = 0;
  auto srv = StatusServer::start(
      o, [&scrapes] { return "x_total " + std::to_string(++scrapes) + "\n"; },
      [] { return std::make_pair(503, std::string("{\"status\":\"waiting\"}")); });
  ASSERT_TRUE(srv.ok()) << srv.status().to_string();
  testing::TestClient c("127.0.0.1", (*srv)->port());
  auto m = c.get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(m->body, "x_total 1\n");
  EXPECT_NE(m->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  auto h = c.get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(h->body, "{\"status\":\"waiting\"}");
  auto missing = c.get("/v1/models");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  // The port is taken: a second server on it is a clear error.
  ServerOptions same = o;
  same.port = (*srv)->port();
  auto dup = StatusServer::start(same, [] { return std::string(); }, [] { return std::make_pair(200, std::string()); });
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find(std::to_string(same.port)), std::string::npos) << dup.status().to_string();
  srv->reset();  // stops and joins; must not hang
  EXPECT_FALSE(c.get("/metrics"));
}

}  // namespace
}  // namespace afd::serve::test_ffn_metrics
