#include <gtest/gtest.h>

#include "serve/metrics/metrics.h"

namespace afd::serve::test_metrics {
namespace {

TEST(Metrics, PrometheusTextHasEveryFamily) {
  Metrics m(2);
  m.request_finished(200);
  m.request_finished(400);
  m.request_finished(200);
  m.ttft.observe(0.02);
  m.tpot.observe(0.004);
  m.worker(1).kv_blocks_total = 10;
  m.worker(1).kv_blocks_used = 4;
  {
    std::lock_guard<std::mutex> l(m.worker(0).mu);
    m.worker(0).stage_sum = {0.3, 0.1, 0.5, 0.1, 1.0, {{0.1, 0.02, 0.25, 0.05}, {0.2, 0.08, 0.25, 0.05}}};
    m.worker(0).busy_s = 1;
    m.worker(0).idle_s = 3;
  }
  std::string t = m.render();
  for (const char* s :
       {"afd_requests_total{code=\"200\"} 2", "afd_requests_total{code=\"400\"} 1", "afd_time_to_first_token_seconds_bucket",
        "afd_time_to_first_token_seconds_count 1", "afd_time_per_output_token_seconds_sum 0.004",
        "afd_queue_depth{worker=\"1\"} 0", "afd_kv_usage_ratio{worker=\"1\"} 0.4",
        "afd_stage_seconds_total{worker=\"0\",stage=\"ffn\"} 0.5", "afd_worker_idle_ratio{worker=\"0\"} 0.75",
        "afd_stage_idle_ratio{worker=\"0\",side=\"attention\"} 0.7", "afd_generation_tokens_total 0",
        "afd_layer_stage_seconds_total{worker=\"0\",layer=\"1\",stage=\"a2f\"} 0.08",
        "afd_layer_stage_seconds_total{worker=\"0\",layer=\"0\",stage=\"ffn\"} 0.25"})
    EXPECT_NE(t.find(s), std::string::npos) << s;
}

TEST(Metrics, SectionsAreAppended) {
  Metrics m(1);
  int calls = 0;
  m.add_section([&calls] { return "x_extra " + std::to_string(++calls) + "\n"; });
  EXPECT_NE(m.render().find("\nx_extra 1\n"), std::string::npos);
  EXPECT_NE(m.render().find("\nx_extra 2\n"), std::string::npos);  // rendered afresh each time
}

TEST(Histogram, QuantilesFromBuckets) {
  Histogram h({0.01, 0.1, 1});
  for (int i = 0; i < 90; ++i) h.observe(0.005);
  for (int i = 0; i < 10; ++i) h.observe(0.5);
  EXPECT_EQ(h.quantile(0.5), 0.01);
  EXPECT_EQ(h.quantile(0.95), 1);
  std::string out;
  h.render("x", &out);
  EXPECT_NE(out.find("x_bucket{le=\"0.1\"} 90"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 100"), std::string::npos);
}

}  // namespace
}  // namespace afd::serve::test_metrics
