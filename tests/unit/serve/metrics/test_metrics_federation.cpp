// Metrics federation: merging several Prometheus texts into one valid exposition, and
// fetching them from live (and dead, and misbehaving) workers.
#include "serve/metrics/metrics_federation.h"

#include <gtest/gtest.h>

#include <chrono>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve/frontend/proxy_client.h"
#include "serve/metrics/ffn_metrics.h"

namespace afd::serve::test_metrics_federation {
namespace {

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

const char* kWorker =
    "# HELP afd_requests_total HTTP API requests by status code\n"
    "# TYPE afd_requests_total counter\n"
    "afd_requests_total{code=\"200\"} 7\n"
    "# HELP afd_generation_tokens_total tokens generated\n"
    "# TYPE afd_generation_tokens_total counter\n"
    "afd_generation_tokens_total 42\n"
    "# TYPE afd_tpot_seconds histogram\n"
    "afd_tpot_seconds_bucket{le=\"0.1\"} 3\n"
    "afd_tpot_seconds_bucket{le=\"+Inf\"} 4\n"
    "afd_tpot_seconds_sum 0.5\n"
    "afd_tpot_seconds_count 4\n";

// Reading one counter from a scrape: the first sample with exactly that name, labels or
// not, timestamp or not; a longer name sharing the prefix is another series.
TEST(PromMerger, FirstValueReadsOneSeries) {
  PromMerger m;
  m.add("# TYPE afd_ffn_tokens_total counter\nafd_ffn_tokens_total_extra 9\n"
        "afd_ffn_tokens_total{ffn=\"1\"} 512 1700000000000\nafd_ffn_tokens_total{ffn=\"2\"} 7\n"
        "afd_up 1\nbroken line here\n",
        "");
  EXPECT_EQ(m.first_value("afd_ffn_tokens_total"), 512.0);
  EXPECT_EQ(m.first_value("afd_ffn_tokens_total_extra"), 9.0);
  EXPECT_EQ(m.first_value("afd_up"), 1.0);
  EXPECT_FALSE(m.first_value("afd_ffn_tokens").has_value());
  EXPECT_FALSE(m.first_value("broken").has_value());
}

TEST(PromMerger, PromSumAddsTheSamplesOfOneNameAndLabel) {
  const std::string text =
      "# TYPE afd_stage_seconds_total counter\n"
      "afd_stage_seconds_total{stage=\"attention\"} 1.5\n"
      "afd_stage_seconds_total{stage=\"ffn\"} 7\n"
      "afd_stage_seconds_total{worker=\"1\",stage=\"attention\"} 2.5 1700000000000\n"
      "afd_stage_seconds_total_extra{stage=\"attention\"} 100\n"
      "afd_stage_seconds_total{stage=\"attention\" broken\n"
      "afd_ffn_batches_total 12\n";
  EXPECT_EQ(prom_sum(text, "afd_stage_seconds_total", "stage=\"attention\""), 4.0);
  EXPECT_EQ(prom_sum(text, "afd_stage_seconds_total"), 11.0);
  EXPECT_EQ(prom_sum(text, "afd_ffn_batches_total"), 12.0);
  EXPECT_FALSE(prom_sum(text, "afd_stage_seconds_total", "stage=\"total\"").has_value());
  EXPECT_FALSE(prom_sum(text, "afd_ffn_batches").has_value());
  EXPECT_FALSE(prom_sum("", "afd_ffn_batches_total").has_value());
}

TEST(PromMerger, OneFamilyPerNameWithEverySourcesLabelledSamples) {
  PromMerger m;
  EXPECT_EQ(m.add("# HELP own_up front end\n# TYPE own_up gauge\nown_up 1\n", ""), 0u);
  EXPECT_EQ(m.add(kWorker, "attention=\"0\""), 0u);
  EXPECT_EQ(m.add(kWorker, "attention=\"1\""), 0u);
  const std::string out = m.render();
  // Each family's header once, its samples from both workers right after it.
  EXPECT_EQ(count(out, "# TYPE afd_requests_total counter\n"), 1u) << out;
  EXPECT_EQ(count(out, "# HELP afd_requests_total "), 1u);
  EXPECT_EQ(count(out, "# TYPE afd_tpot_seconds histogram\n"), 1u);
  EXPECT_NE(out.find("# TYPE afd_requests_total counter\n"
                     "afd_requests_total{attention=\"0\",code=\"200\"} 7\n"
                     "afd_requests_total{attention=\"1\",code=\"200\"} 7\n"),
            std::string::npos)
      << out;
  // A sample without labels gets a label set; histogram series stay in their family.
  EXPECT_NE(out.find("afd_generation_tokens_total{attention=\"1\"} 42\n"), std::string::npos);
  EXPECT_NE(out.find("afd_tpot_seconds_bucket{attention=\"0\",le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(out.find("afd_tpot_seconds_count{attention=\"0\"} 4\n"
                     "afd_tpot_seconds_bucket{attention=\"1\",le=\"0.1\"} 3\n"),
            std::string::npos)
      << out;
  // The unlabelled source comes first and is left as it was.
  EXPECT_EQ(out.find("# HELP own_up front end\n# TYPE own_up gauge\nown_up 1\n"), 0u) << out;
  EXPECT_EQ(m.families(), 4u);
  // What it renders parses again with nothing dropped.
  PromMerger again;
  EXPECT_EQ(again.add(out, "x=\"y\""), 0u);
}

TEST(PromMerger, BadLinesAreDroppedAndCountedTheRestKept) {
  PromMerger m;
  const std::string text =
      "# TYPE good gauge\n"
      "good{a=\"1\"} 1\n"
      "good{a=} 2\n"                // no value
      "good{a=\"x} 3\n"             // unterminated value
      "good{a=\"\\q\"} 4\n"         // bad escape
      "good{a=\"2\"} four\n"        // not a number
      "good{a=\"3\"} 5 6 7\n"       // too many fields
      "{a=\"4\"} 5\n"               // no name
      "# TYPE good sometype\n"      // no such type
      "good{a=\"5\",} 6 1700000000000\n"  // trailing comma and a timestamp are fine
      "good{a=\"6\"} +Inf\n"
      "good{a=\"7\",b=\"q\\\"uo\\\\te\\n\"} NaN\n"
      "\n# a plain comment\n";
  EXPECT_EQ(m.add(text, "w=\"0\""), 7u);
  const std::string out = m.render();
  EXPECT_NE(out.find("good{w=\"0\",a=\"1\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("good{w=\"0\",a=\"5\"} 6 1700000000000\n"), std::string::npos) << out;
  EXPECT_NE(out.find("good{w=\"0\",a=\"6\"} +Inf\n"), std::string::npos) << out;
  EXPECT_NE(out.find("good{w=\"0\",a=\"7\",b=\"q\\\"uo\\\\te\\n\"} NaN\n"), std::string::npos) << out;
  EXPECT_EQ(count(out, "\ngood{"), 4u) << out;
  // Binary garbage is not an exposition: all of it dropped, nothing crashes.
  std::string garbage;
  for (int i = 0; i < 4096; ++i) garbage += static_cast<char>((i * 131 + 7) % 256);
  PromMerger g;
  EXPECT_GT(g.add(garbage, ""), 0u);
}

TEST(PromMerger, ClashingTypesClashingLabelsAndRepeatedSeries) {
  PromMerger m;
  EXPECT_EQ(m.add("# TYPE x_total counter\nx_total 1\n", "w=\"0\""), 0u);
  // The same family declared as a gauge by another worker: its samples cannot join.
  EXPECT_EQ(m.add("# TYPE x_total gauge\nx_total 2\nx_total{k=\"v\"} 3\n", "w=\"1\""), 2u);
  // A source label with our label's name is kept as exported_<name>.
  EXPECT_EQ(m.add("# TYPE y gauge\ny{w=\"inner\"} 5\n", "w=\"2\""), 0u);
  // Two workers without a distinguishing label and the same series: the first one wins.
  EXPECT_EQ(m.add("# TYPE z gauge\nz{ffn=\"0\"} 1\n", ""), 0u);
  EXPECT_EQ(m.add("# TYPE z gauge\nz{ffn=\"0\"} 2\nz{ffn=\"1\"} 3\n", ""), 0u);
  const std::string out = m.render();
  EXPECT_NE(out.find("x_total{w=\"0\"} 1\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("x_total{w=\"1\""), std::string::npos) << out;
  EXPECT_NE(out.find("y{w=\"2\",exported_w=\"inner\"} 5\n"), std::string::npos) << out;
  EXPECT_NE(out.find("z{ffn=\"0\"} 1\nz{ffn=\"1\"} 3\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("z{ffn=\"0\"} 2"), std::string::npos) << out;
}

// A worker's GET /metrics served by the StatusServer the FFN workers use.
std::unique_ptr<StatusServer> serve_text(std::function<std::string()> text) {
  ServerOptions o;
  o.port = 0;
  o.http_threads = 2;
  auto s = StatusServer::start(o, std::move(text), [] { return std::make_pair(200, std::string("{}")); });
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

// A port bound but not listening (held for the test): connections to it are refused.
struct ClosedPort {
  int fd = -1, port = 0;
  ClosedPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
  }
  ~ClosedPort() {
    if (fd >= 0) ::close(fd);
  }
};

TEST(FederateMetrics, LiveDeadAndOversizedWorkers) {
  auto a = serve_text([] { return std::string(kWorker); });
  // b is itself a federating front end: its afd_federation_* families must merge with ours.
  auto b = serve_text([] {
    return std::string(
        "# TYPE afd_ffn_tokens_total counter\nafd_ffn_tokens_total{ffn=\"0\"} 9\n"
        "# TYPE afd_federation_target_up gauge\nafd_federation_target_up{target=\"10.0.0.9:9100\"} 1\n");
  });
  auto huge = serve_text([] { return std::string(kMaxScrapeBytes + 1, '#'); });
  ASSERT_TRUE(a && b && huge);
  ClosedPort closed;
  ASSERT_GT(closed.port, 0);
  const int dead = closed.port;
  std::vector<MetricsTarget> targets = {{"127.0.0.1", a->port(), "attention=\"0\""},
                                        {"127.0.0.1", b->port(), ""},
                                        {"127.0.0.1", dead, "attention=\"1\""},
                                        {"127.0.0.1", huge->port(), ""}};
  const auto t0 = std::chrono::steady_clock::now();
  const std::string out = federate_metrics("# TYPE front_up gauge\nfront_up 1\n", targets, 2000, http_scrape_metrics);
  // Nobody made it wait for its timeout (refused and oversized answers end at once).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(out.find("# TYPE front_up gauge\nfront_up 1\n"), 0u) << out;
  EXPECT_NE(out.find("afd_requests_total{attention=\"0\",code=\"200\"} 7\n"), std::string::npos) << out;
  EXPECT_NE(out.find("afd_ffn_tokens_total{ffn=\"0\"} 9\n"), std::string::npos) << out;
  auto up = [&](int port) {
    const std::string key = "afd_federation_target_up{target=\"127.0.0.1:" + std::to_string(port) + "\"} ";
    const size_t at = out.find(key);
    return at == std::string::npos ? std::string("missing") : out.substr(at + key.size(), 1);
  };
  EXPECT_EQ(up(a->port()), "1");
  EXPECT_EQ(up(b->port()), "1");
  EXPECT_EQ(up(dead), "0");
  EXPECT_EQ(up(huge->port()), "0");
  EXPECT_NE(out.find("afd_federation_dropped_lines{target=\"127.0.0.1:" + std::to_string(a->port()) + "\"} 0\n"),
            std::string::npos);
  EXPECT_NE(out.find("# TYPE afd_federation_scrape_seconds gauge\n"), std::string::npos);
  EXPECT_EQ(count(out, "# TYPE afd_federation_target_up gauge\n"), 1u) << out;
  EXPECT_NE(out.find("afd_federation_target_up{target=\"10.0.0.9:9100\"} 1\n"), std::string::npos) << out;
  // The whole answer is one valid exposition again.
  PromMerger check;
  EXPECT_EQ(check.add(out, ""), 0u);
}

TEST(FederateMetrics, TargetAddresses) {
  auto t = metrics_target_for("0.0.0.0:9100", "host3", "attention=\"2\"");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->address(), "host3:9100");
  EXPECT_EQ(t->label, "attention=\"2\"");
  t = metrics_target_for("10.0.0.5:9100", "host3", "");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->address(), "10.0.0.5:9100");
  EXPECT_FALSE(metrics_target_for("nonsense", "host3", "").ok());
}

}  // namespace
}  // namespace afd::serve::test_metrics_federation
