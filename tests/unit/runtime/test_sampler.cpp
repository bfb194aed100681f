#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "runtime/sampler.h"

namespace afd {
namespace {

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  std::vector<float> l = {0.1f, 2.0f, 2.0f, -1.0f};
  auto t = s.sample(l.data(), 4);
  EXPECT_EQ(t.token, 1);
  double z = 0;
  for (float x : l) z += std::exp(x);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-5);
}

TEST(Sampler, SeededIsReproducible) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 0.7f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(l.data(), 50).token, b.sample(l.data(), 50).token);
}

// A sampler continued elsewhere (attention-worker failover) from its position in the random
// stream draws exactly what the original draws after that point; greedy sampling draws none.
TEST(Sampler, SkipResumesTheRandomStreamExactly) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 0.7f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 7;
  Sampler original(p);
  std::vector<int32_t> first, rest;
  for (int i = 0; i < 13; ++i) first.push_back(original.sample(l.data(), 50).token);
  EXPECT_EQ(original.draws(), 13u);
  for (int i = 0; i < 40; ++i) rest.push_back(original.sample(l.data(), 50).token);
  Sampler resumed(p);
  resumed.skip(13);
  EXPECT_EQ(resumed.draws(), 13u);
  std::vector<int32_t> again;
  for (int i = 0; i < 40; ++i) again.push_back(resumed.sample(l.data(), 50).token);
  EXPECT_EQ(again, rest);
  // Not skipping (or skipping one too few) gives another stream: the position matters.
  Sampler off(p);
  off.skip(12);
  std::vector<int32_t> shifted;
  for (int i = 0; i < 40; ++i) shifted.push_back(off.sample(l.data(), 50).token);
  EXPECT_NE(shifted, rest);

  SamplingParams g;  // greedy
  Sampler greedy(g);
  for (int i = 0; i < 5; ++i) greedy.sample(l.data(), 50);
  EXPECT_EQ(greedy.draws(), 0u);
}

TEST(Sampler, TopKRestrictsCandidates) {
  std::vector<float> l = {5, 4, 3, 2, 1, 0};
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 2;
  p.seed = 1;
  Sampler s(p);
  for (int i = 0; i < 500; ++i) EXPECT_LT(s.sample(l.data(), 6).token, 2);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // probs ~ 0.665, 0.245, 0.09: top_p 0.6 keeps only the first.
  std::vector<float> l = {2, 1, 0};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.6f;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.sample(l.data(), 3).token, 0);
}

TEST(Sampler, TemperatureSamplingMatchesDistribution) {
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  Sampler s(p);
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[s.sample(l.data(), 3).token]++;
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.02);
}

// A token mask (structured outputs): greedy takes the best allowed token; sampling draws from
// the distribution renormalised over the allowed tokens, with top-k counted among them;
// logprobs stay those of the raw row.
TEST(Sampler, MaskRestrictsEveryPath) {
  std::vector<float> l = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  const uint64_t mask = 0b1010;  // tokens 1 and 3
  Sampler greedy(SamplingParams{});
  SampledToken g = greedy.sample(l.data(), 4, &mask);
  EXPECT_EQ(g.token, 1);
  EXPECT_NEAR(g.logprob, std::log(0.3), 1e-5);
  EXPECT_EQ(greedy.sample(l.data(), 4).token, 0);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 3;
  Sampler s(p);
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[s.sample(l.data(), 4, &mask).token]++;
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_NEAR(counts[1] / double(n), 0.75, 0.02);
  EXPECT_NEAR(counts[3] / double(n), 0.25, 0.02);
  p.top_k = 1;  // the best allowed token, not the best token
  Sampler k1(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(k1.sample(l.data(), 4, &mask).token, 1);
  // A mask far below the row's maximum still normalises (no underflow to an empty mass).
  std::vector<float> far = {1000.0f, -1000.0f, -1001.0f};
  const uint64_t low = 0b110;
  p.top_k = 0;
  Sampler f(p);
  for (int i = 0; i < 100; ++i) EXPECT_NE(f.sample(far.data(), 3, &low).token, 0);
  // verify: a rejected draft is replaced by an allowed token.
  Sampler v(p);
  for (int i = 0; i < 200; ++i) {
    bool acc = false;
    const int32_t t = v.verify(l.data(), 4, 3, &acc, &mask).token;
    EXPECT_TRUE(t == 1 || t == 3);
    EXPECT_EQ(acc, t == 3);
  }
}

// The sampler finds the token at u of the mass by partitioning instead of sorting the row; the
// token must be the one a walk over the fully sorted candidates (logit descending, id
// ascending) gives, with top-k and top-p cut in that order, on rows with ties.
TEST(Sampler, SelectionMatchesAWalkOverTheSortedRow) {
  std::mt19937_64 gen(5);
  for (int row = 0; row < 40; ++row) {
    const int64_t vocab = 50 + static_cast<int64_t>(gen() % 3000);
    std::vector<float> l(static_cast<size_t>(vocab));
    for (auto& x : l) x = static_cast<float>(static_cast<int>(gen() % 200) - 100) / 16.0f;  // many ties
    SamplingParams p;
    p.temperature = 0.5f + static_cast<float>(gen() % 4) * 0.5f;
    p.top_k = gen() % 3 == 0 ? 1 + static_cast<int64_t>(gen() % 100) : 0;
    p.top_p = gen() % 2 ? 1.0f : 0.3f + static_cast<float>(gen() % 7) * 0.1f;
    p.seed = gen();
    // The reference: sort, cut, walk.
    std::vector<std::pair<float, int32_t>> c;
    for (int64_t i = 0; i < vocab; ++i) c.emplace_back(l[i], static_cast<int32_t>(i));
    std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    if (p.top_k > 0 && p.top_k < vocab) c.resize(static_cast<size_t>(p.top_k));
    std::vector<double> w;
    double z = 0;
    for (auto& [x, id] : c) {
      w.push_back(std::exp((static_cast<double>(x) - c[0].first) / p.temperature));
      z += w.back();
    }
    if (p.top_p < 1.0f) {
      double acc = 0;
      for (size_t i = 0; i < c.size(); ++i) {
        acc += w[i] / z;
        if (acc >= p.top_p) {
          c.resize(i + 1);
          w.resize(i + 1);
          break;
        }
      }
    }
    double mass = 0;
    for (double x : w) mass += x;
    std::mt19937_64 ref_rng(p.seed);
    Sampler s(p);
    for (int draw = 0; draw < 50; ++draw) {
      const double u = static_cast<double>(ref_rng() >> 11) * (1.0 / 9007199254740992.0);
      double acc = 0;
      int32_t want = c.back().second;
      for (size_t i = 0; i < c.size(); ++i) {
        acc += w[i];
        if (u * mass < acc) {
          want = c[i].second;
          break;
        }
      }
      ASSERT_EQ(s.sample(l.data(), vocab).token, want) << "row " << row << " draw " << draw;
    }
  }
}

TEST(Sampler, TopLogprobsSortedAndValidated) {
  std::vector<float> l = {0, 3, 1, 2};
  SamplingParams p;
  p.n_top_logprobs = 3;
  Sampler s(p);
  auto t = s.sample(l.data(), 4);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].first, 1);
  EXPECT_EQ(t.top_logprobs[1].first, 3);
  EXPECT_EQ(t.top_logprobs[2].first, 2);
  SamplingParams bad;
  bad.top_p = 0;
  EXPECT_FALSE(bad.validate().is_ok());
  bad = {};
  bad.temperature = -1;
  EXPECT_FALSE(bad.validate().is_ok());
  bad = {};
  bad.n_top_logprobs = 21;
  EXPECT_FALSE(bad.validate().is_ok());
}

}  // namespace
}  // namespace afd
