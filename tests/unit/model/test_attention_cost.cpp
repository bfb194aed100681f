// The engine's attention cost (model/attention_cost.h) against the planner's formulas
// (plan/model_builders.cpp) for every reference checkpoint's config.json: both read the same
// file, so any disagreement is a counting difference between engine and cost model.
#include "model/attention_cost.h"

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "plan/hf_model_spec.h"

namespace afd {
namespace {

std::vector<std::string> reference_dirs() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(AFD_SOURCE_DIR "/tests/reference/data"))
    if (std::filesystem::exists(e.path() / "config.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(AttentionCost, MatchesThePlannersFormulasForEveryReferenceConfig) {
  const auto dirs = reference_dirs();
  ASSERT_GE(dirs.size(), 10u);
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto c = load_model_config(dir);
    ASSERT_TRUE(c.ok()) << c.status().message();
    plan::HfSpecOptions po;
    po.kv_elem_bytes = 1.0;  // bytes == values
    auto spec = plan::load_hf_model_spec(dir, po);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    ASSERT_EQ(spec->attn.size(), 1u);
    const plan::AttnGroup& g = spec->attn[0];
    const AttentionCost a = attention_cost(*c);
    EXPECT_DOUBLE_EQ(a.kv_values_per_token, g.kv_bytes_per_token);
    EXPECT_DOUBLE_EQ(a.projection_params, g.linear_params());
    if (c->attention == AttentionKind::mla) {
      // The planner counts the value product over the whole cached row (latent + rope, as
      // the Step-3 paper does); the engine's absorbed kernel reads only the latent for it.
      EXPECT_EQ(g.label, "MLA");
      EXPECT_DOUBLE_EQ(a.core_flops_per_ctx_token,
                       g.flops_per_ctx_token - 2.0 * c->n_heads * c->qk_rope_head_dim);
    } else {
      EXPECT_EQ(g.label, c->q_lora_rank > 0 ? "MFA" : "GQA");
      EXPECT_DOUBLE_EQ(a.core_flops_per_ctx_token, g.flops_per_ctx_token);
    }
  }
}

}  // namespace
}  // namespace afd
