// EPLB (plan/eplb.h): counts files, the placement's invariants, and the balance it reaches on
// skewed loads against the contiguous placement.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "plan/eplb.h"

namespace afd::plan::test_eplb {
namespace {

// Tokens per expert when each of `tokens` tokens picks `top_k` distinct experts with
// probability proportional to 1/(rank+1)^s (a Zipf popularity), ranks permuted by `seed`.
std::vector<double> zipf_counts(int64_t n_experts, int64_t top_k, double s, int64_t tokens, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> weight(static_cast<size_t>(n_experts));
  std::vector<int64_t> perm(static_cast<size_t>(n_experts));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = n_experts - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(rng.uniform_int(0, i))]);
  for (int64_t r = 0; r < n_experts; ++r)
    weight[static_cast<size_t>(perm[static_cast<size_t>(r)])] = 1.0 / std::pow(static_cast<double>(r + 1), s);
  std::vector<double> counts(static_cast<size_t>(n_experts), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> w = weight;
    for (int64_t k = 0; k < top_k; ++k) {
      const double total = std::accumulate(w.begin(), w.end(), 0.0);
      double u = rng.uniform_open0() * total;
      size_t e = 0;
      for (; e + 1 < w.size(); ++e) {
        if (u <= w[e]) break;
        u -= w[e];
      }
      counts[e] += 1;
      w[e] = 0;  // distinct experts per token
    }
  }
  return counts;
}

TEST(Eplb, ContiguousPlacementIsAfdsStaticParts) {
  const std::vector<double> c = {1, 2, 3, 4, 5, 6, 7, 8};
  const LayerPlacement p = contiguous_placement(c, 2);
  EXPECT_EQ(p.worker_experts[0], (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.worker_experts[1], (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_DOUBLE_EQ(p.worker_load[0], 10);
  EXPECT_DOUBLE_EQ(p.worker_load[1], 26);
  EXPECT_DOUBLE_EQ(p.max_over_mean(), 26.0 / 18.0);
  EXPECT_TRUE(check_placement(p, 8).is_ok());
}

TEST(Eplb, ReplicatesTheHottestExpertAndSplitsItsLoad) {
  // Expert 0 holds half of all tokens: without a replica one worker carries >= 50%.
  const std::vector<double> c = {8, 1, 1, 1, 1, 1, 1, 2};
  auto p = eplb_placement(c, {.n_workers = 2, .redundant = 2});
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_TRUE(check_placement(p.value(), 8).is_ok());
  EXPECT_EQ(p.value().expert_workers[0].size(), 2u);  // 8 -> 4 + 4 on both workers
  EXPECT_DOUBLE_EQ(p.value().max_over_mean(), 1.0);
  // Without replicas the best is 8 + 1 against 1*5 + 2 (a worker holds 4).
  auto q = eplb_placement(c, {.n_workers = 2, .redundant = 0});
  ASSERT_TRUE(q.ok());
  EXPECT_NEAR(q.value().max_load(), 11.0, 1e-12);
}

TEST(Eplb, ZipfSkewIsBalancedWithAQuarterMoreReplicas) {
  // Issue targets: 1A2F and 1A4F (small models), and a DeepSeek-V3-like 256-expert top-8 layer on 64 workers.
  struct Case {
    int64_t experts, top_k;
    int workers;
    int64_t redundant;
  };
  for (const Case& k : {Case{64, 4, 2, 16}, Case{64, 4, 4, 16}, Case{128, 8, 4, 32}, Case{256, 8, 64, 64}}) {
    const auto c = zipf_counts(k.experts, k.top_k, 1.0, 4000, 7);
    const double before = contiguous_placement(c, k.workers).max_over_mean();
    auto p = eplb_placement(c, {.n_workers = k.workers, .redundant = k.redundant});
    ASSERT_TRUE(p.ok()) << p.status().message();
    ASSERT_TRUE(check_placement(p.value(), k.experts).is_ok());
    SCOPED_TRACE(std::to_string(k.experts) + " experts on " + std::to_string(k.workers) + " workers");
    EXPECT_GE(before, 1.2);
    EXPECT_LE(p.value().max_over_mean(), 1.10) << "contiguous " << before;
    // Loads add up to the counts: the split over replicas loses no token.
    const double total = std::accumulate(c.begin(), c.end(), 0.0);
    const auto& l = p.value().worker_load;
    EXPECT_NEAR(std::accumulate(l.begin(), l.end(), 0.0), total, 1e-6 * total);
  }
}

TEST(Eplb, RefusesOptionsThatCannotBePlaced) {
  const std::vector<double> c(8, 1.0);
  auto a = eplb_placement(c, {.n_workers = 3, .redundant = 0});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("do not divide over 3 workers"), std::string::npos);
  auto b = eplb_placement(c, {.n_workers = 2, .redundant = 10});  // 9 per worker > 8 experts
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("hold an expert twice"), std::string::npos);
  EXPECT_FALSE(eplb_placement(c, {.n_workers = 0}).ok());
  EXPECT_FALSE(eplb_placement(c, {.n_workers = 2, .redundant = -2}).ok());
  EXPECT_FALSE(eplb_placement({1, -1}, {.n_workers = 1}).ok());
  auto big = eplb_placement(std::vector<double>(70000, 1.0), {.n_workers = 1});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("past the planner's size"), std::string::npos);
  EXPECT_FALSE(eplb_placement(std::vector<double>(4096, 1.0), {.n_workers = 32768}).ok());
}

TEST(Eplb, EveryWorkerCanHoldEveryExpert) {
  const std::vector<double> c = {5, 1, 1, 1};
  auto p = eplb_placement(c, {.n_workers = 4, .redundant = 12});  // 4 per worker: all of them
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_TRUE(check_placement(p.value(), 4).is_ok());
  EXPECT_DOUBLE_EQ(p.value().max_over_mean(), 1.0);
}

TEST(Eplb, CheckPlacementNamesWhatIsWrong) {
  LayerPlacement p;
  p.worker_experts = {{0, 1}, {1, 1}};
  p.expert_workers = {{0}, {0, 1, 1}, {}};
  auto s = check_placement(p, 3);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("worker 1 holds expert 1 twice"), std::string::npos);
  p.worker_experts = {{0, 1}, {1, 0}};
  s = check_placement(p, 3);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("expert 2 has no replica"), std::string::npos);
  p.worker_experts = {{0, 1, 2}, {1}};
  EXPECT_NE(check_placement(p, 3).message().find("worker 1 holds 1 replicas"), std::string::npos);
}

TEST(Eplb, CountsFromJson) {
  auto c = parse_expert_counts(R"({"n_experts": 3, "layers": [{"layer": 1, "counts": [1, 2, 3]},
                                   {"layer": 4, "counts": [0, 0, 7.5]}]})",
                               "t.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c.value().layer_ids, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(c.value().counts[1][2], 7.5);
  auto bare = parse_expert_counts("[[1, 2], [3, 4]]", "b.json");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare.value().layer_ids, (std::vector<int64_t>{0, 1}));
}

TEST(Eplb, CountsFromPrometheusAddWorkersSamples) {
  const std::string text =
      "# HELP afd_ffn_expert_tokens_total Tokens routed\n"
      "# TYPE afd_ffn_expert_tokens_total counter\n"
      "afd_ffn_routed_experts{ffn=\"ffn-0\"} 3\n"
      "afd_ffn_routed_experts{ffn=\"ffn-1\"} 3\n"
      "afd_ffn_expert_tokens_total{worker=\"ffn-0\",layer=\"2\",expert=\"0\"} 5\n"
      "afd_ffn_expert_tokens_total{worker=\"ffn-0\",layer=\"2\",expert=\"1\"} 1\n"
      "afd_ffn_expert_tokens_total{worker=\"ffn-1\",layer=\"2\",expert=\"1\"} 2\n"
      "afd_ffn_expert_tokens_total{worker=\"ffn-\\\"2\\\"\", layer=\"2\",expert=\"2\"} 4 1700000000000\r\n"
      "afd_ffn_steps_total 10\n"
      "afd_ffn_expert_tokens_total_created 3\n";
  auto c = parse_expert_counts(text, "metrics");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c.value().n_experts, 3);
  EXPECT_EQ(c.value().layer_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(c.value().counts[0], (std::vector<double>{5, 3, 4}));
}

TEST(Eplb, BadCountsFilesGetClearErrors) {
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& b : {Bad{"", "empty"},
                       Bad{"{", "invalid JSON"},
                       Bad{R"({"layers": []})", "no layers"},
                       Bad{"[[1, 2], [3]]", "layer 1 has 1 experts, expected 2"},
                       Bad{"[[1, -2]]", "layer 0 expert 1: count -2"},
                       Bad{R"({"layers": [{"layer": 0, "counts": [1]}, {"layer": 0, "counts": [2]}]})", "repeated"},
                       Bad{R"({"layers": [{"layer": 0, "counts": ["x"]}]})", "not a number"},
                       Bad{R"({"n_experts": 2, "layers": [{"layer": 0, "counts": [1]}]})", "expected 2"},
                       Bad{"afd_ffn_expert_tokens_total{layer=\"0\",expert=\"1\"} 3\n", "no afd_ffn_routed_experts"},
                       Bad{"afd_ffn_routed_experts 2\nafd_ffn_expert_tokens_total{layer=\"0\",expert=\"2\"} 3\n",
                           "names expert 2 of 2"},
                       Bad{"afd_ffn_routed_experts{a=\"1\"} 0\n", "positive integer"},
                       Bad{"afd_ffn_expert_tokens_total{layer=\"0\"} 3\n", "integer labels"},
                       Bad{"afd_ffn_expert_tokens_total 3\n", "integer labels"},
                       Bad{"afd_ffn_expert_tokens_total{layer=\"0\",expert=\"0\" 3\n", "not a valid Prometheus sample"},
                       Bad{"afd_ffn_expert_tokens_total{layer=\"0\",expert=\"0\"} 3 x\n", "not a valid Prometheus sample"},
                       Bad{"afd_ffn_expert_tokens_total{layer=\"0\",expert=\"0\"} -1\n", "not a finite"},
                       Bad{"something_else 1\n", "no afd_ffn_expert_tokens_total samples"}}) {
    auto c = parse_expert_counts(b.text, "f");
    ASSERT_FALSE(c.ok()) << b.text;
    EXPECT_NE(c.status().message().find(b.says), std::string::npos) << c.status().message();
  }
}

TEST(Eplb, ReplicaMemoryIsCheckedWithTheBytesNeeded) {
  // 64 experts + 16 on 4 workers: 20 replicas per layer x 10 layers x 1 MiB = 200 MiB.
  EXPECT_TRUE(check_replica_memory(64, {.n_workers = 4, .redundant = 16}, 10, 1 << 20, 200.0 * (1 << 20)).is_ok());
  auto s = check_replica_memory(64, {.n_workers = 4, .redundant = 16}, 10, 1 << 20, 100.0 * (1 << 20));
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::resource_exhausted);
  EXPECT_NE(s.message().find("0.1953 GiB"), std::string::npos) << s.message();
}

TEST(Eplb, CountsMustCoverEveryMoeLayerOfTheModel) {
  ModelConfig m;
  m.n_layers = 4;
  m.n_experts = 4;
  m.n_experts_per_tok = 2;
  m.first_k_dense_replace = 1;  // layer 0 dense, 1..3 MoE
  ASSERT_FALSE(m.is_moe_layer(0));
  ASSERT_TRUE(m.is_moe_layer(3));
  ExpertCounts c;
  c.n_experts = 4;
  c.layer_ids = {1, 2, 3};
  c.counts = {{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}};
  EXPECT_TRUE(check_counts_cover_model(c, m).ok());
  c.layer_ids = {1, 3, 4};
  EXPECT_NE(check_counts_cover_model(c, m).message().find("no row for layer 2, a MoE layer"), std::string::npos);
  c.layer_ids = {0, 1, 2, 3};
  c.counts.push_back({1, 1, 1, 1});
  EXPECT_NE(check_counts_cover_model(c, m).message().find("row for layer 0, which has no routed experts"),
            std::string::npos);
  c.layer_ids = {1, 2, 3, 7};
  EXPECT_NE(check_counts_cover_model(c, m).message().find("past the model's 4 layers"), std::string::npos);
  c.n_experts = 8;
  EXPECT_NE(check_counts_cover_model(c, m).message().find("8 experts per layer, the model 4"), std::string::npos);
}

TEST(Eplb, PlanCoversEveryLayerAndPrintsJson) {
  ExpertCounts c;
  c.n_experts = 4;
  c.layer_ids = {0, 3};
  c.counts = {{4, 1, 1, 2}, {1, 1, 1, 1}};
  auto p = plan_eplb(c, {.n_workers = 2, .redundant = 2});
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p.value().layers.size(), 2u);
  const std::string j = placement_to_json(p.value(), 2, 2);
  EXPECT_NE(j.find("\"layer\":3"), std::string::npos) << j;
  EXPECT_EQ(plan_contiguous(c, 2).layers[0].worker_experts[1], (std::vector<int32_t>{2, 3}));
}

}  // namespace
}  // namespace afd::plan::test_eplb
