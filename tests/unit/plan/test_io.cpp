// File formats: latency profiles and accelerator JSON; HF config.json model specs.
#include <gtest/gtest.h>

#include "plan/accelerator.h"
#include "plan/cost_model.h"
#include "plan/hf_model_spec.h"
#include "plan/latency_profile.h"
#include "plan/model_presets.h"

namespace afd::plan::test_io {
namespace {

TEST(PlanIo, ProfileRoundTrip) {
  LatencyProfile p = af_ratio_paper_profile();
  p.attention.fit = LinearFitQuality{12, 0.99, 1e-3, 2e-3};
  auto q = parse_profile_json(profile_to_json(p), "mem");
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_DOUBLE_EQ(q->attention.alpha, p.attention.alpha);
  EXPECT_DOUBLE_EQ(q->ffn.beta, p.ffn.beta);
  EXPECT_DOUBLE_EQ(q->comm.alpha, p.comm.alpha);
  EXPECT_EQ(q->attention.fit->n, 12);
  EXPECT_EQ(q->time_unit, "cycles");
}

TEST(PlanIo, ProfileErrors) {
  EXPECT_FALSE(parse_profile_json("{", "p.json").ok());
  EXPECT_FALSE(parse_profile_json(R"({"format":"other","version":1})", "p.json").ok());
  auto r = parse_profile_json(
      R"({"format":"afd-latency-profile","version":1,"attention":{"alpha":1,"beta":0},"ffn":{"alpha":"x","beta":0},"comm":{"alpha":0,"beta":0}})",
      "p.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ffn"), std::string::npos);
  // Negative parameters are rejected.
  EXPECT_FALSE(parse_profile_json(
                   R"({"format":"afd-latency-profile","version":1,"attention":{"alpha":-1,"beta":0},"ffn":{"alpha":1,"beta":0},"comm":{"alpha":0,"beta":0}})",
                   "p.json")
                   .ok());
}

TEST(PlanIo, AcceleratorJson) {
  auto v = parse_accelerators_json(
      R"([{"id":"X1","usd_per_hour":1.5,"flops_bf16":1e14,"mem_bw":1e12,"net_bw":2.5e10,"cards_per_server":4}])", "a.json");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 1u);
  EXPECT_EQ((*v)[0].id, "x1");
  EXPECT_DOUBLE_EQ((*v)[0].model_flops(), 1e14);  // no FP8: BF16
  EXPECT_EQ((*v)[0].cards_per_server, 4);
  EXPECT_FALSE(parse_accelerators_json(R"({"id":"y","mem_bw":1e12})", "a.json").ok());  // no flops
  EXPECT_FALSE(parse_accelerators_json(R"({"id":"y","flops_bf16":1e14,"mem_bw":-1})", "a.json").ok());
  EXPECT_FALSE(parse_accelerators_json("[1]", "a.json").ok());
}

// `parsed` (from a config.json) costs a decode token at `ctx` exactly what `preset` does.
void expect_same_token_cost(const ModelSpec& parsed, const ModelSpec& preset, int64_t ctx) {
  const TokenCost a = decode_token_cost(parsed, ctx), b = decode_token_cost(preset, ctx);
  EXPECT_DOUBLE_EQ(a.kv_bytes, b.kv_bytes);
  EXPECT_DOUBLE_EQ(a.attn_flops, b.attn_flops);
  EXPECT_DOUBLE_EQ(a.linear_flops, b.linear_flops);
  EXPECT_DOUBLE_EQ(a.ffn_flops, b.ffn_flops);
}

// A DeepSeek-V3 config.json gives the same per-token counts as the preset.
TEST(PlanIo, HfConfigDeepSeekV3MatchesPreset) {
  const char* cfg = R"({
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
    "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3})";
  auto m = parse_hf_model_spec(cfg, "config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  expect_same_token_cost(*m, *find_model_preset("deepseek-v3"), 8192);
}

TEST(PlanIo, HfConfigQwen3MoeMatchesPreset) {
  const char* cfg = R"({
    "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 94,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
    "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "intermediate_size": 12288})";
  auto m = parse_hf_model_spec(cfg, "config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  expect_same_token_cost(*m, *find_model_preset("qwen3-235b-a22b"), 32768);
}

// stepfun-ai/step3 layout: the text model under "text_config", MoE layers 4..59.
TEST(PlanIo, HfConfigStep3MatchesPreset) {
  std::string layers;
  for (int l = 4; l < 60; ++l) {
    if (l > 4) layers += ',';
    layers += std::to_string(l);
  }
  const std::string cfg = R"({"model_type": "step3_vl", "text_config": {
    "model_type": "step3_text", "hidden_size": 7168, "intermediate_size": 18432,
    "num_attention_heads": 64, "num_attention_groups": 1, "num_hidden_layers": 61, "head_dim": 256,
    "share_q_dim": 2048, "moe_num_experts": 48, "moe_top_k": 3, "moe_intermediate_size": 5120,
    "share_expert_dim": 5120, "moe_layers_enum": ")" + layers + R"("}})";
  auto m = parse_hf_model_spec(cfg, "config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelSpec p = *find_model_preset("step3");
  expect_same_token_cost(*m, p, 8192);
  EXPECT_DOUBLE_EQ(m->moe_sparsity(), p.moe_sparsity());
  EXPECT_DOUBLE_EQ(m->ffn_weight_bytes(), p.ffn_weight_bytes());
}

// The engine's reader (model/config.h) decides the layers: a step3_vl config without
// moe_layers_enum has a dense layer 0 and MoE layers after it, as the engine loads it.
TEST(PlanIo, HfConfigLayersAreTheEnginesLayers) {
  const std::string cfg = R"({"model_type": "step3_vl", "text_config": {
    "model_type": "step3_text", "hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4,
    "num_attention_groups": 1, "num_hidden_layers": 4, "head_dim": 64, "share_q_dim": 128,
    "moe_num_experts": 8, "moe_top_k": 2, "moe_intermediate_size": 192, "share_expert_dim": 192}})";
  auto m = parse_hf_model_spec(cfg, "config.json");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto c = parse_model_config(cfg);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(m->ffn.size(), 2u);
  EXPECT_EQ(m->ffn[0].label, "dense");
  EXPECT_EQ(m->ffn[0].n_layers, 1);
  EXPECT_EQ(m->ffn[1].n_layers, 3);
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(c->is_moe_layer(l), l > 0);
  EXPECT_EQ(m->id, "step3_text");
  EXPECT_EQ(m->attn[0].label, "MFA");
  // "step3v" is no Hugging Face model_type (the checkpoints say step3_vl): refused as the engine refuses it.
  std::string renamed = cfg;
  renamed.replace(renamed.find("step3_vl"), 8, "step3v");
  renamed.replace(renamed.find("step3_text"), 10, "step3v");
  EXPECT_FALSE(parse_hf_model_spec(renamed, "config.json").ok());
}

TEST(PlanIo, HfConfigErrorsNameTheField) {
  auto r = parse_hf_model_spec(R"({"model_type":"qwen3_moe","vocab_size":1000,"hidden_size":"big"})", "c.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("hidden_size"), std::string::npos);
  EXPECT_FALSE(parse_hf_model_spec(R"({"model_type":"mamba"})", "c.json").ok());
  EXPECT_FALSE(parse_hf_model_spec("not json", "c.json").ok());
}

}  // namespace
}  // namespace afd::plan::test_io
