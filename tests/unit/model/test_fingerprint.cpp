// model_fingerprint / model_config_fingerprint (model/fingerprint.h): what makes two
// models' identities differ, and what keeps them equal.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tiny_model.h"
#include "model/checkpoint.h"
#include "model/fingerprint.h"
#include "model/tools/make_model.h"
#include "model/weights.h"

namespace afd {
namespace {

std::shared_ptr<const ModelWeights> tiny(const std::string& tag, int64_t n_layers, uint64_t seed) {
  return test::make_tiny_moe("afd_test_fingerprint_" + tag, n_layers, seed);
}

// Two loads of one checkpoint agree; another seed (same architecture and shapes) differs in
// the sampled stored bytes; another layer count differs in the config and the matrices.
TEST(Fingerprint, WeightsIdentity) {
  auto a = tiny("a", 2, 3);
  auto reseeded = tiny("a_seed4", 2, 4);
  auto deeper = tiny("b", 3, 3);
  ASSERT_TRUE(a && reseeded && deeper);
  auto again = load_model(a->checkpoint->dir());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(model_fingerprint(*a), model_fingerprint(**again));
  EXPECT_NE(model_fingerprint(*a), model_fingerprint(*reseeded));
  EXPECT_NE(model_fingerprint(*a), model_fingerprint(*deeper));
  // The config part alone does not see the values, only the architecture and dimensions.
  EXPECT_EQ(model_config_fingerprint(a->config), model_config_fingerprint(reseeded->config));
  EXPECT_NE(model_config_fingerprint(a->config), model_config_fingerprint(deeper->config));
  // The weights' fingerprint covers more than the config's.
  EXPECT_NE(model_fingerprint(*a), model_config_fingerprint(a->config));
}

// The handshake's config fingerprint covers the DeepSeek / Step-3 fields: two sides that
// disagree on attention kind, low-rank ranks, routing method, groups, scaling, score bias,
// layer rules or YaRN refuse each other.
TEST(Fingerprint, ConfigCoversFamilyFields) {
  for (Arch a : {Arch::deepseek_v3, Arch::deepseek_v2, Arch::step3_text}) {
    auto base = make_preset_config(a, "tiny");
    ASSERT_TRUE(base.ok()) << base.status().to_string();
    const uint64_t fp = model_config_fingerprint(*base);
    std::vector<std::function<void(ModelConfig&)>> edits = {
        [](ModelConfig& c) { c.q_lora_rank += 1; },
        [](ModelConfig& c) { c.kv_lora_rank += 1; },
        [](ModelConfig& c) { c.qk_rope_head_dim += 2; },
        [](ModelConfig& c) { c.v_head_dim += 1; },
        [](ModelConfig& c) { c.attention = c.attention == AttentionKind::mla ? AttentionKind::gqa : AttentionKind::mla; },
        [](ModelConfig& c) { c.scoring = c.scoring == RouterScoring::softmax ? RouterScoring::sigmoid : RouterScoring::softmax; },
        [](ModelConfig& c) { c.topk_method = c.topk_method == TopkMethod::greedy ? TopkMethod::noaux_tc : TopkMethod::greedy; },
        [](ModelConfig& c) { c.n_group += 1; },
        [](ModelConfig& c) { c.topk_group += 1; },
        [](ModelConfig& c) { c.routed_scaling_factor *= 2; },
        [](ModelConfig& c) { c.has_score_bias = !c.has_score_bias; },
        [](ModelConfig& c) { c.shared_expert_ungated = !c.shared_expert_ungated; },
        [](ModelConfig& c) { c.first_k_dense_replace += 1; },
        [](ModelConfig& c) { c.moe_layer_freq += 1; },
        [](ModelConfig& c) { c.moe_layers.push_back(0); },
        [](ModelConfig& c) { c.rope_interleave = !c.rope_interleave; },
        [](ModelConfig& c) { c.rope_scaling.factor += 1; },
        [](ModelConfig& c) { c.rope_scaling.mscale_all_dim += 0.5; },
        [](ModelConfig& c) { c.weight_quant = WeightQuant::fp8_block; },
    };
    for (size_t i = 0; i < edits.size(); ++i) {
      ModelConfig c = *base;
      edits[i](c);
      EXPECT_NE(model_config_fingerprint(c), fp) << arch_name(a) << " edit " << i;
    }
  }
}

}  // namespace
}  // namespace afd
