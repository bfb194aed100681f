// plan::decode_step_cost against a count over the loaded weights of every reference
// checkpoint: FLOPs are 2 per weight a token meets (attention projections, top-k routed and
// shared experts or the dense FFN, router, LM head) plus core attention per context token.
#include "plan/step_cost.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/weights.h"
#include "plan/hf_model_spec.h"

namespace afd::test_step_cost {
namespace {

std::vector<std::string> reference_dirs() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(AFD_SOURCE_DIR "/tests/reference/data"))
    if (std::filesystem::exists(e.path() / "config.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

double params(const Matrix& m) { return static_cast<double>(m.rows) * static_cast<double>(m.cols); }
double params(const FfnWeights& f) { return params(f.gate) + params(f.up) + params(f.down); }

TEST(StepCost, CountsEveryWeightATokenMeetsOnEveryReferenceCheckpoint) {
  const auto dirs = reference_dirs();
  ASSERT_GE(dirs.size(), 10u);
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto w = load_model(dir);
    ASSERT_TRUE(w.ok()) << w.status().message();
    const ModelConfig& c = (*w)->config;
    double attn = 0, ffn = 0, other = 0;  // weights one token meets
    for (const LayerWeights& L : (*w)->layers) {
      const AttentionWeights& a = L.attn;
      for (const Matrix* m : {&a.q_a, &a.q, &a.k, &a.v, &a.kv_a, &a.kv_b, &a.o}) attn += params(*m);
      if (L.is_moe) {
        ffn += static_cast<double>(c.n_experts_per_tok) * params(L.moe.experts[0]);
        if (!L.moe.shared.empty()) ffn += params(L.moe.shared);
        other += params(L.moe.router);
      } else {
        ffn += params(L.dense);
      }
    }
    other += params((*w)->lm_head);
    // Core attention FLOPs per decode token per context token, as the planner counts them:
    // q.k and p.v over the cached row (MLA: latent + rope for both, the Step-3 paper's way).
    const double heads = static_cast<double>(c.n_heads);
    const double core = c.attention == AttentionKind::mla
                            ? 4.0 * heads * static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim)
                            : 4.0 * heads * static_cast<double>(c.head_dim);
    const double kv_values = c.attention == AttentionKind::mla
                                 ? static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim)
                                 : 2.0 * static_cast<double>(c.n_kv_heads * c.head_dim);

    const plan::ModelSpec spec = plan::model_spec_from_config(c, {.kv_elem_bytes = 2.0});
    const plan::StepWeightReads reads{.fixed_bytes = 1000.0, .routed_expert_bytes = 10.0, .expert_reads = 7};
    const int64_t batch = 3, ctx = 100;
    const plan::StepCost s = plan::decode_step_cost(spec, batch, ctx, reads);
    const double layers = static_cast<double>(c.n_layers);
    EXPECT_DOUBLE_EQ(s.attention_flops, batch * (2.0 * attn + ctx * layers * core));
    EXPECT_DOUBLE_EQ(s.expert_flops, batch * 2.0 * ffn);
    EXPECT_DOUBLE_EQ(s.flops, s.attention_flops + s.expert_flops + batch * 2.0 * other);
    EXPECT_DOUBLE_EQ(s.weight_bytes, 1070.0);
    EXPECT_DOUBLE_EQ(s.bytes, 1070.0 + batch * ctx * layers * kv_values * 2.0);
  }
}

}  // namespace
}  // namespace afd::test_step_cost
