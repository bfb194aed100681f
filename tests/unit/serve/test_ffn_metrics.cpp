// An FFN worker process's observability: its stats as Prometheus text, and the status
// server that answers /metrics and /health (afd worker --role ffn --metrics-listen).
#include <gtest/gtest.h>

#include <httplib.h>

#include "serve/ffn_metrics.h"

namespace afd::serve {
namespace {

TEST(FfnMetrics, PrometheusTextCarriesTheWorkersCounters) {
  FfnWorkerStats s;
  s.batches = 5;
  s.frames = 7;
  s.tokens = 70;
  s.multi_peer_batches = 2;
  s.ffn_ns = 500000000;  // 0.5 s of compute
  s.started_ns = 1000000000;
  s.attention_serving = 2;
  s.peer_losses = 1;
  s.late_peers = 3;
  s.bad_frames = 4;
  s.refused = 6;
  // Batches of 1, 3, 3, 20 and 10000 tokens.
  for (int64_t n : {1, 3, 3, 20, 10000}) s.batch_tokens[FfnWorkerStats::token_bucket(n)]++;
  FfnWorkerInfo info;
  info.shard = 1;
  info.n_shards = 2;
  info.n_attention = 3;
  info.model = "00ff";
  const std::string t = render_ffn_worker_metrics(s, info, /*now_ns=*/3000000000);  // 2 s after the start
  for (const char* want :
       {"afd_ffn_worker_info{shard=\"1\",n_shards=\"2\",tp=\"1\",device=\"cpu\",model=\"00ff\"} 1",
        "afd_ffn_attention_workers{state=\"serving\"} 2\n", "afd_ffn_attention_workers{state=\"expected\"} 3\n",
        "afd_ffn_batches_total 5\n", "afd_ffn_frames_total 7\n", "afd_ffn_tokens_total 70\n",
        "afd_ffn_multi_worker_batches_total 2\n", "afd_ffn_compute_seconds_total 0.5\n", "afd_ffn_bad_frames_total 4\n",
        "afd_ffn_refused_handshakes_total 6\n", "afd_ffn_peer_losses_total 1\n", "afd_ffn_late_peers_total 3\n",
        "# TYPE afd_ffn_batch_tokens histogram\n",
        // Cumulative buckets: <=1: 1; <=2: 1; <=4: 3; <=16: 3; <=32: 4; <=8192: 4; +Inf: 5.
        "afd_ffn_batch_tokens_bucket{le=\"1\"} 1\n", "afd_ffn_batch_tokens_bucket{le=\"2\"} 1\n",
        "afd_ffn_batch_tokens_bucket{le=\"4\"} 3\n", "afd_ffn_batch_tokens_bucket{le=\"16\"} 3\n",
        "afd_ffn_batch_tokens_bucket{le=\"32\"} 4\n", "afd_ffn_batch_tokens_bucket{le=\"8192\"} 4\n",
        "afd_ffn_batch_tokens_bucket{le=\"+Inf\"} 5\n", "afd_ffn_batch_tokens_count 5\n",
        "afd_ffn_uptime_seconds 2\n", "afd_ffn_idle_ratio 0.75\n"})
    EXPECT_NE(t.find(want), std::string::npos) << want << "\n" << t;
  // Before the worker starts: no uptime, fully idle.
  FfnWorkerStats fresh;
  const std::string t0 = render_ffn_worker_metrics(fresh, info, 5);
  EXPECT_NE(t0.find("afd_ffn_uptime_seconds 0\n"), std::string::npos) << t0;
  EXPECT_NE(t0.find("afd_ffn_idle_ratio 1\n"), std::string::npos) << t0;
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
  httplib::Client c("127.0.0.1", (*srv)->port());
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(m->body, "x_total 1\n");
  EXPECT_NE(m->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(h->body, "{\"status\":\"waiting\"}");
  auto missing = c.Get("/v1/models");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  // The port is taken: a second server on it is a clear error.
  ServerOptions same = o;
  same.port = (*srv)->port();
  auto dup = StatusServer::start(same, [] { return std::string(); }, [] { return std::make_pair(200, std::string()); });
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find(std::to_string(same.port)), std::string::npos) << dup.status().to_string();
  srv->reset();  // stops and joins; must not hang
  EXPECT_FALSE(c.Get("/metrics"));
}

}  // namespace
}  // namespace afd::serve
