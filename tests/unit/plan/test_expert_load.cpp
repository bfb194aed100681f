// Expert load model (plan/expert_load.h): top-k shares without replacement, per-layer profiles,
// the imbalance of the contiguous and EPLB placements, and the configuration checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "plan/expert_load.h"

namespace afd::plan::test_expert_load {
namespace {

ExpertLoadConfig dsv3_like(ExpertPlacementKind placement, int64_t redundant) {
  ExpertLoadConfig c;
  c.n_experts = 256;
  c.top_k = 8;
  c.zipf_s = 1.0;
  c.placement = placement;
  c.redundant = redundant;
  return c;
}

TEST(SimExpertLoad, TopkSharesSumToOneAndFlattenTheTop) {
  // top_k = E: every token picks every expert once.
  for (double share : topk_rank_shares(16, 16, 1.0, 1000, 3)) EXPECT_EQ(share, 1.0 / 16.0);
  // top_k = 1: shares are the weights; 4e5 draws, σ of the top share ≈ 6e-4.
  const std::vector<double> one = topk_rank_shares(16, 1, 1.0, 400000, 3);
  double harmonic = 0;
  for (int r = 1; r <= 16; ++r) harmonic += 1.0 / r;
  for (int r = 0; r < 16; ++r) EXPECT_NEAR(one[static_cast<size_t>(r)], 1.0 / (r + 1) / harmonic, 3e-3) << r;
  // Zipf 1.0 over 256 experts, top-8 distinct: the hottest gets about 10% of the pairs, well
  // below its 1/H_256 = 16.3% for one pick, and the shares do not increase with rank.
  const std::vector<double> s = topk_rank_shares(256, 8, 1.0, 200000, 5);
  EXPECT_NEAR(std::accumulate(s.begin(), s.end(), 0.0), 1.0, 1e-12);
  EXPECT_GT(s[0], 0.09);
  EXPECT_LT(s[0], 0.11);
  EXPECT_GT(s[0], s[1]);
  EXPECT_GT(s[1], s[2]);
  EXPECT_GT(s[10], s[200]);
}

// Top-2 of 4: rank j's share of pairs is (P(first = j) + Σ_{i≠j} P(first = i) w_j / (W - w_i)) / 2.
// s = 3 puts 85% of the weight on rank 0, so its second picks take the exact (sum tree) path;
// s = 0.5 mostly the rejection path. 4e5 tokens: σ <= 6e-4 per share.
TEST(SimExpertLoad, TopkSharesMatchSuccessiveSamplingWithoutReplacement) {
  for (double zipf : {0.5, 3.0}) {
    SCOPED_TRACE(zipf);
    std::vector<double> w(4);
    for (int r = 0; r < 4; ++r) w[static_cast<size_t>(r)] = 1.0 / std::pow(r + 1.0, zipf);
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    const std::vector<double> s = topk_rank_shares(4, 2, zipf, 400000, 11);
    for (size_t j = 0; j < 4; ++j) {
      double second = 0;
      for (size_t i = 0; i < 4; ++i)
        if (i != j) second += w[i] / total * w[j] / (total - w[i]);
      EXPECT_NEAR(s[j], (w[j] / total + second) / 2, 3e-3) << "rank " << j;
    }
  }
}

TEST(SimExpertLoad, OffIsOneProfileOfOne) {
  auto r = expert_imbalance(ExpertLoadConfig{}, 4, 10, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->profile_max_over_mean, std::vector<double>{1.0});
  EXPECT_EQ(r->mean, 1.0);
  EXPECT_EQ(r->max, 1.0);
}

TEST(SimExpertLoad, ProfilesAreSeededPerLayerAndCycle) {
  const ExpertLoadConfig c = dsv3_like(ExpertPlacementKind::contiguous, 0);
  auto a = expert_imbalance(c, 64, 100, 9);
  auto b = expert_imbalance(c, 64, 100, 9);
  auto d = expert_imbalance(c, 64, 100, 10);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  ASSERT_EQ(a->profile_max_over_mean.size(), static_cast<size_t>(kMaxExpertProfiles));
  EXPECT_EQ(a->profile_max_over_mean, b->profile_max_over_mean);
  EXPECT_NE(a->profile_max_over_mean, d->profile_max_over_mean);
  // Different layers put the hot experts on different workers.
  const auto& p = a->profile_max_over_mean;
  EXPECT_NE(*std::min_element(p.begin(), p.end()), *std::max_element(p.begin(), p.end()));
  // 100 layers: profiles 0..63, then 0..35 again.
  double sum = 0;
  for (int l = 0; l < 100; ++l) sum += p[static_cast<size_t>(l % 64)];
  EXPECT_DOUBLE_EQ(a->mean, sum / 100);
  EXPECT_EQ(a->max, *std::max_element(p.begin(), p.end()));
  // Fewer layers than the cap: one profile per layer, the first ones of the same sequence.
  auto few = expert_imbalance(c, 64, 3, 9);
  ASSERT_TRUE(few.ok());
  EXPECT_EQ(few->profile_max_over_mean, std::vector<double>(p.begin(), p.begin() + 3));
}

// Issue 41's deployment: 256 experts, top-8, Zipf 1.0 on 64 FFN workers.
TEST(SimExpertLoad, EplbWithAQuarterMoreReplicasBalancesWhatContiguousDoesNot) {
  auto contiguous = expert_imbalance(dsv3_like(ExpertPlacementKind::contiguous, 0), 64, 16, 1);
  auto eplb = expert_imbalance(dsv3_like(ExpertPlacementKind::eplb, 64), 64, 16, 1);
  ASSERT_TRUE(contiguous.ok() && eplb.ok()) << eplb.status().to_string();
  EXPECT_GE(contiguous->mean, 1.5);
  EXPECT_LT(eplb->mean, 1.10);
  EXPECT_LT(eplb->max, 1.10);
  EXPECT_GE(eplb->mean, 1.0);
  // The plan sees a sampled window: 64 tokens (8 pairs per worker) plan worse than the default.
  ExpertLoadConfig small = dsv3_like(ExpertPlacementKind::eplb, 64);
  small.window_tokens = 64;
  auto noisy = expert_imbalance(small, 64, 16, 1);
  ASSERT_TRUE(noisy.ok());
  EXPECT_GT(noisy->mean, eplb->mean + 0.05);
  // A uniform popularity is nearly balanced by the contiguous parts alone.
  ExpertLoadConfig uniform = dsv3_like(ExpertPlacementKind::contiguous, 0);
  uniform.zipf_s = 0;
  auto flat = expert_imbalance(uniform, 64, 16, 1);
  ASSERT_TRUE(flat.ok());
  EXPECT_LT(flat->max, 1.02);
}

TEST(SimExpertLoad, RejectsBadValuesSayingWhich) {
  struct Bad {
    ExpertLoadConfig c;
    int64_t n_ffn;
    const char* says;
  };
  auto with = [](auto edit) {
    ExpertLoadConfig c = dsv3_like(ExpertPlacementKind::eplb, 64);
    edit(c);
    return c;
  };
  const std::vector<Bad> bad = {
      {with([](auto& c) { c.n_experts = -1; }), 64, "n_experts = -1"},
      {with([](auto& c) { c.n_experts = 5000; }), 64, "n_experts = 5000"},
      {with([](auto& c) { c.top_k = 0; }), 64, "top_k = 0"},
      {with([](auto& c) { c.top_k = 257; }), 64, "top_k = 257"},
      {with([](auto& c) { c.zipf_s = -0.5; }), 64, "zipf_s"},
      {with([](auto& c) { c.zipf_s = std::nan(""); }), 64, "zipf_s"},
      {with([](auto& c) { c.window_tokens = 0; }), 64, "window_tokens = 0"},
      {with([](auto& c) { c.window_tokens = 1000000; }), 64, "window_tokens * top_k = 8000000 exceeds"},
      {with([](auto& c) { c.redundant = -4; }), 64, "cannot be negative"},
      {with([](auto& c) { c.placement = ExpertPlacementKind::contiguous; }), 64, "need the eplb placement"},
      {with([](auto& c) {
         c.placement = ExpertPlacementKind::contiguous;
         c.redundant = 0;
       }),
       512, "cannot give each of 512"},
      {with([](auto&) {}), 60, "320 replicas do not divide over 60 workers"},
      {with([](auto&) {}), 1, "exceed the 256 experts"},
  };
  for (const Bad& b : bad) {
    const Status s = b.c.validate(b.n_ffn);
    ASSERT_FALSE(s.is_ok()) << b.says;
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    EXPECT_NE(s.message().find(b.says), std::string::npos) << s.message();
    EXPECT_FALSE(expert_imbalance(b.c, b.n_ffn, 4, 1).ok()) << b.says;
  }
  EXPECT_TRUE(dsv3_like(ExpertPlacementKind::eplb, 64).validate(64).is_ok());
  EXPECT_FALSE(expert_imbalance(dsv3_like(ExpertPlacementKind::eplb, 64), 64, 0, 1).ok());
}

}  // namespace
}  // namespace afd::plan::test_expert_load
