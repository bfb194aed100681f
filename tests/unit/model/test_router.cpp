// route_tokens against hand-computed cases for every routing variant (MODELS.md A4, B5, B8).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/router.h"

namespace afd {
namespace {

struct Routed {
  std::vector<int32_t> ids;  // sorted ascending, weights permuted alike
  std::vector<float> w;
};

Routed route(const ModelConfig& c, std::vector<float> logits, const std::vector<float>& bias = {}) {
  const int64_t K = c.n_experts_per_tok;
  std::vector<int32_t> ids(K);
  std::vector<float> w(K);
  route_tokens(c, logits.data(), bias.empty() ? nullptr : bias.data(), 1, ids.data(), w.data());
  std::vector<int> order(K);
  for (int i = 0; i < K; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
  Routed r;
  for (int i : order) {
    r.ids.push_back(ids[i]);
    r.w.push_back(w[i]);
  }
  return r;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// logit whose sigmoid is p.
float logit(float p) { return std::log(p / (1 - p)); }

ModelConfig base(int64_t E, int64_t K) {
  ModelConfig c;
  c.n_experts = E;
  c.n_experts_per_tok = K;
  return c;
}

TEST(Router, SoftmaxTopKWithoutRenormIsStep3) {
  // Step-3: softmax over all experts, raw probabilities (sum < 1), no scale.
  ModelConfig c = base(4, 2);
  std::vector<float> l = {std::log(1.f), std::log(4.f), std::log(2.f), std::log(3.f)};  // probs 0.1 .4 .2 .3
  Routed r = route(c, l);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.w[0], 0.4f, 1e-6);
  EXPECT_NEAR(r.w[1], 0.3f, 1e-6);
  c.norm_topk_prob = true;  // norm_expert_weight: 0.4 / 0.7, 0.3 / 0.7
  r = route(c, l);
  EXPECT_NEAR(r.w[0], 0.4f / 0.7f, 1e-6);
  EXPECT_NEAR(r.w[1], 0.3f / 0.7f, 1e-6);
}

TEST(Router, SigmoidNoauxTcBiasChangesSelectionButNotWeights) {
  // 4 experts, one group, top-2. Sigmoid scores .9 .8 .7 .1; bias +0.25 on expert 2 makes its
  // choice score 0.95 > 0.8: {0, 2} instead of {0, 1}. Weights stay the unbiased .9 and .7,
  // renormalised (.9/1.6, .7/1.6) and scaled by 2.5.
  ModelConfig c = base(4, 2);
  c.scoring = RouterScoring::sigmoid;
  c.topk_method = TopkMethod::noaux_tc;
  c.has_score_bias = true;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  const std::vector<float> l = {logit(.9f), logit(.8f), logit(.7f), logit(.1f)};
  Routed unbiased = route(c, l, {0, 0, 0, 0});
  EXPECT_EQ(unbiased.ids, (std::vector<int32_t>{0, 1}));
  Routed r = route(c, l, {0, 0, 0.25f, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(r.w[0], 2.5f * .9f / 1.6f, 1e-5);
  EXPECT_NEAR(r.w[1], 2.5f * .7f / 1.6f, 1e-5);
}

TEST(Router, NoauxTcGroupMaskExcludesWhatPlainTopKWouldPick) {
  // 8 experts in 4 groups of 2, keep 2 groups, top-2. Sigmoid scores:
  //   group 0: .95 .05 (top-2 sum 1.00)   group 1: .60 .60 (1.20)
  //   group 2: .55 .55 (1.10)             group 3: .10 .10 (0.20)
  // Plain top-2 would take expert 0 (.95) and one .60; the group step keeps groups 1 and 2
  // (sums 1.2, 1.1 beat group 0's 1.0), so expert 0 is masked to -inf and the pick is {2, 3}.
  ModelConfig c = base(8, 2);
  c.scoring = RouterScoring::sigmoid;
  c.topk_method = TopkMethod::noaux_tc;
  c.has_score_bias = true;
  c.n_group = 4;
  c.topk_group = 2;
  c.norm_topk_prob = false;
  const std::vector<float> p = {.95f, .05f, .6f, .6f, .55f, .55f, .1f, .1f};
  std::vector<float> l;
  for (float x : p) l.push_back(logit(x));
  const std::vector<float> zero(8, 0.0f);
  Routed r = route(c, l, zero);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.w[0], .6f, 1e-5);
  ModelConfig plain = c;
  plain.n_group = 1;
  plain.topk_group = 1;
  Routed rp = route(plain, l, zero);
  EXPECT_EQ(rp.ids[0], 0);  // what the mask excluded
  // The bias decides group scores too: +0.3 on expert 1 lifts group 0 to 1.30 -> groups 0, 1;
  // top-2 of the kept choice values {.95, .35, .6, .6} is {0, and the lower-id .6: 2}.
  std::vector<float> bias(8, 0.0f);
  bias[1] = 0.3f;
  r = route(c, l, bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(r.w[0], .95f, 1e-5);  // unbiased
}

TEST(Router, GroupLimitedGreedyRanksGroupsByMax) {
  // DeepSeek-V2: softmax, groups ranked by their max prob. 6 experts, 3 groups of 2, keep 1
  // group, top-2. Probs (logits = log p): group 0: .30 .00x  group 1: .25 .25  group 2: .1 .1
  // Group maxima .30 > .25 > .1 -> only group 0 is kept, even though group 1 holds more mass:
  // picks {0, 1}. Weights = probs (no renorm) * 2.0.
  ModelConfig c = base(6, 2);
  c.topk_method = TopkMethod::group_limited_greedy;
  c.n_group = 3;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.0;
  const std::vector<float> p = {.30f, .0001f, .25f, .25f, .0999f, .1f};
  std::vector<float> l;
  for (float x : p) l.push_back(std::log(x));
  Routed r = route(c, l);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(r.w[0], 2.0f * .30f, 1e-5);
  EXPECT_NEAR(r.w[1], 2.0f * .0001f, 1e-6);
  // Greedy (V2-Lite) on the same logits: plain top-2 {0, 2} (ties to the lower id).
  c.topk_method = TopkMethod::greedy;
  r = route(c, l);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
}

TEST(Router, SigmoidWithoutGroupsRenormAndScale) {
  // Kimi-K2 style: n_group 1, sigmoid, noaux_tc, renormalised, x 2.827.
  ModelConfig c = base(3, 2);
  c.scoring = RouterScoring::sigmoid;
  c.topk_method = TopkMethod::noaux_tc;
  c.has_score_bias = true;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.827;
  const std::vector<float> l = {0.5f, -1.0f, 2.0f};
  Routed r = route(c, l, {0, 0, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  const float s0 = sigmoid(0.5f), s2 = sigmoid(2.0f);
  EXPECT_NEAR(r.w[0], 2.827f * s0 / (s0 + s2), 1e-5);
  EXPECT_NEAR(r.w[1], 2.827f * s2 / (s0 + s2), 1e-5);
}

TEST(Router, SeveralTokensAreIndependent) {
  ModelConfig c = base(4, 1);
  std::vector<float> l = {0, 1, 0, 0, /*token 1*/ 3, 0, 0, 0};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  route_tokens(c, l.data(), nullptr, 2, ids.data(), w.data());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 0);
}

}  // namespace
}  // namespace afd
