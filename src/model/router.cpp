// Expert selection (MODELS.md A4, B5, B8):
//   scores s = softmax(logits) or sigmoid(logits)              [E]
//   choice  = s + e_score_correction_bias (noaux_tc), else s   [E]
//   grouped methods: view choice as [n_group, E/n_group]; a group's score is the sum of its two
//     largest choice values (noaux_tc) or its largest (group_limited_greedy); keep the
//     topk_group best groups, every expert of another group gets choice -inf
//   ids = top-k of choice; weights = s[ids] (the bias never enters a weight),
//     / sum(weights) iff norm_topk_prob, * routed_scaling_factor.
#include "model/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"

namespace afd {

namespace {

// The k largest of v[0..n) into out (descending; ties to the lower index). `taken` [n] scratch.
void top_k(const float* v, int64_t n, int64_t k, int32_t* out, std::vector<uint8_t>& taken) {
  taken.assign(static_cast<size_t>(n), 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      if (taken[e]) continue;
      if (best < 0 || v[e] > v[best]) best = e;
    }
    taken[best] = 1;
    out[j] = static_cast<int32_t>(best);
  }
}

// Sum of the two largest of g[0..m) (the single value when m == 1).
float top2_sum(const float* g, int64_t m) {
  float a = -std::numeric_limits<float>::infinity(), b = a;
  for (int64_t i = 0; i < m; ++i) {
    if (g[i] > a) {
      b = a;
      a = g[i];
    } else if (g[i] > b) {
      b = g[i];
    }
  }
  return m == 1 ? a : a + b;
}

}  // namespace

void route_tokens(const ModelConfig& c, float* logits, const float* score_bias, int64_t n, int32_t* ids,
                  float* weights) {
  const int64_t E = c.n_experts, K = c.n_experts_per_tok;
  const bool grouped = c.topk_method != TopkMethod::greedy && c.n_group > 1;
  const int64_t G = grouped ? c.n_group : 1, per = E / G;
  const float* bias = c.topk_method == TopkMethod::noaux_tc ? score_bias : nullptr;
  std::vector<float> choice(static_cast<size_t>(E)), gscore(static_cast<size_t>(G));
  std::vector<int32_t> kept(static_cast<size_t>(G));
  std::vector<uint8_t> taken, keep(static_cast<size_t>(G));
  for (int64_t i = 0; i < n; ++i) {
    float* s = &logits[i * E];
    if (c.scoring == RouterScoring::sigmoid) {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-s[e]));
    } else {
      kernels::softmax(s, E);
    }
    for (int64_t e = 0; e < E; ++e) choice[e] = bias ? s[e] + bias[e] : s[e];
    if (grouped) {
      for (int64_t g = 0; g < G; ++g) {
        const float* cg = &choice[g * per];
        if (c.topk_method == TopkMethod::noaux_tc) {
          gscore[g] = top2_sum(cg, per);
        } else {
          float m = cg[0];
          for (int64_t e = 1; e < per; ++e) m = std::max(m, cg[e]);
          gscore[g] = m;
        }
      }
      top_k(gscore.data(), G, c.topk_group, kept.data(), taken);
      keep.assign(static_cast<size_t>(G), 0);
      for (int64_t j = 0; j < c.topk_group; ++j) keep[kept[j]] = 1;
      for (int64_t g = 0; g < G; ++g)
        if (!keep[g])
          for (int64_t e = g * per; e < (g + 1) * per; ++e) choice[e] = -std::numeric_limits<float>::infinity();
    }
    int32_t* id = &ids[i * K];
    float* w = &weights[i * K];
    top_k(choice.data(), E, K, id, taken);
    for (int64_t j = 0; j < K; ++j) w[j] = s[id[j]];
    if (c.norm_topk_prob) {
      float sum = 0;
      for (int64_t j = 0; j < K; ++j) sum += w[j];
      for (int64_t j = 0; j < K; ++j) w[j] /= sum;
    }
    if (c.routed_scaling_factor != 1.0) {
      const float f = static_cast<float>(c.routed_scaling_factor);
      for (int64_t j = 0; j < K; ++j) w[j] *= f;
    }
  }
}

}  // namespace afd
