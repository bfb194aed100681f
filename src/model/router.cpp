#include "model/router.h"

#include "kernels/cpu/ops.h"

namespace afd {

void route_tokens(const ModelConfig& c, float* logits, const float* score_bias, int64_t n, int32_t* ids,
                  float* weights) {
  (void)score_bias;
  const int64_t E = c.n_experts, K = c.n_experts_per_tok;
  for (int64_t i = 0; i < n; ++i) {
    float* p = &logits[i * E];
    kernels::softmax(p, E);
    int32_t* id = &ids[i * K];
    float* wts = &weights[i * K];
    for (int64_t j = 0; j < K; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t t = 0; t < j; ++t) taken |= id[t] == e;
        if (taken) continue;
        if (best < 0 || p[e] > p[best]) best = static_cast<int32_t>(e);
      }
      id[j] = best;
      wts[j] = p[best];
    }
    if (c.norm_topk_prob) {
      float s = 0;
      for (int64_t j = 0; j < K; ++j) s += wts[j];
      for (int64_t j = 0; j < K; ++j) wts[j] /= s;
    }
  }
}

}  // namespace afd
