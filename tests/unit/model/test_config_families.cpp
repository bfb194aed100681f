// config.json parsing for DeepSeek-V2/V3, Kimi-K2 and Step-3 (step3_text, step3_vl's
// text_config): field names, HF defaults, and every bad input answered with an error naming
// the field (MODELS.md A1, B1, B8).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/tools/make_model.h"

namespace afd::test_config_families {
namespace {

using json = nlohmann::json;

// The dsv3-tiny config of MODELS.md D2.
json dsv3() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 384, "moe_intermediate_size": 160,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 192, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
    "n_routed_experts": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4, "n_shared_experts": 2,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_nextn_predict_layers": 1,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
    "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "max_position_embeddings": 163840, "rope_interleave": true, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": false, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
      "weight_block_size": [128, 128]}})");
}

// The step3-tiny text config of MODELS.md D1.
json step3_text() {
  return json::parse(R"({
    "architectures": ["Step3TextForCausalLM"], "model_type": "step3_text",
    "hidden_size": 256, "num_attention_heads": 4, "num_attention_groups": 1, "head_dim": 64, "share_q_dim": 192,
    "intermediate_size": 384, "moe_num_experts": 8, "moe_top_k": 3, "moe_intermediate_size": 160,
    "share_expert_dim": 192, "norm_expert_weight": false, "num_hidden_layers": 4, "moe_layers_enum": "1,2",
    "rope_theta": 500000.0, "rope_scaling": null, "max_position_embedding": 4096, "max_seq_len": 4096,
    "rms_norm_eps": 1e-5, "vocab_size": 1024})");
}

json step3_vl(const json& text) {
  json j = {{"architectures", {"Step3VLForConditionalGeneration"}},
            {"model_type", "step3_vl"},
            {"text_config", text},
            {"bos_token_id", 3},
            {"eos_token_id", 4},
            {"vision_config", {{"hidden_size", 32}, {"model_type", "step3_vision_encoder"}}},
            {"quantization_config",
             {{"activation_scheme", "dynamic"},
              {"fmt", "e4m3"},
              {"quant_method", "fp8"},
              {"weight_block_size", {128, 128}}}}};
  return j;
}

ModelConfig parse_ok(const json& j) {
  auto r = parse_model_config(j.dump(), "dir/config.json");
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : ModelConfig{};
}

void expect_error(const json& j, StatusCode code, std::initializer_list<const char*> needles) {
  auto r = parse_model_config(j.dump(), "dir/config.json");
  ASSERT_FALSE(r.ok()) << "accepted " << j.dump();
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find("dir/config.json"), std::string::npos) << r.status().message();
  for (const char* n : needles) EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
}

TEST(ConfigDeepseek, V3Fields) {
  ModelConfig c = parse_ok(dsv3());
  EXPECT_EQ(c.arch, Arch::deepseek_v3);
  EXPECT_EQ(c.attention, AttentionKind::mla);
  EXPECT_EQ(c.q_lora_rank, 192);
  EXPECT_EQ(c.kv_lora_rank, 128);
  EXPECT_EQ(c.qk_nope_head_dim, 64);
  EXPECT_EQ(c.qk_rope_head_dim, 32);
  EXPECT_EQ(c.v_head_dim, 64);
  EXPECT_EQ(c.qk_head_dim(), 96);
  EXPECT_EQ(c.head_dim, 96);
  EXPECT_EQ(c.o_in_dim(), 4 * 64);
  EXPECT_EQ(c.n_experts, 16);
  EXPECT_EQ(c.n_experts_per_tok, 4);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_EQ(c.scoring, RouterScoring::sigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::noaux_tc);
  EXPECT_TRUE(c.has_score_bias);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.shared_expert_intermediate_size, 320);
  EXPECT_TRUE(c.shared_expert_ungated);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_TRUE(c.rope_interleave);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::yarn);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 40);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(c.weight_quant, WeightQuant::fp8_block);
  EXPECT_FALSE(c.is_moe_layer(0));  // first_k_dense_replace 1
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
}

TEST(ConfigDeepseek, V3DefaultsFollowTransformers) {
  // A config with only the type: DeepseekV3Config's defaults (the 671B model).
  ModelConfig c = parse_ok(json{{"model_type", "deepseek_v3"}});
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.n_layers, 61);
  EXPECT_EQ(c.n_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.n_experts, 256);
  EXPECT_EQ(c.n_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.shared_expert_intermediate_size, 2048);
  EXPECT_EQ(c.scoring, RouterScoring::sigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::noaux_tc);
  EXPECT_TRUE(c.rope_interleave);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::none);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
}

TEST(ConfigDeepseek, V2LiteStyle) {
  json j = dsv3();
  j["model_type"] = "deepseek_v2";
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  j["q_lora_rank"] = nullptr;  // direct q_proj
  j.erase("scoring_func");
  j.erase("topk_method");
  j.erase("norm_topk_prob");
  j.erase("routed_scaling_factor");
  j["n_group"] = 4;
  j["moe_layer_freq"] = 2;
  j["first_k_dense_replace"] = 0;
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.arch, Arch::deepseek_v2);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.scoring, RouterScoring::softmax);
  EXPECT_EQ(c.topk_method, TopkMethod::greedy);
  EXPECT_FALSE(c.has_score_bias);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_TRUE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  j["topk_method"] = "group_limited_greedy";
  EXPECT_EQ(parse_ok(j).topk_method, TopkMethod::group_limited_greedy);
  // V2's expert counts default to None: required.
  j.erase("n_routed_experts");
  expect_error(j, StatusCode::invalid_argument, {"n_routed_experts", "missing"});
}

TEST(ConfigDeepseek, KimiK2ReadsAsV3) {
  json j = dsv3();
  j["model_type"] = "kimi_k2";
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["routed_scaling_factor"] = 2.827;
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.arch, Arch::deepseek_v3);
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.827);
}

TEST(ConfigDeepseek, ArchitectureWithoutModelType) {
  json j = dsv3();
  j.erase("model_type");
  EXPECT_EQ(parse_ok(j).arch, Arch::deepseek_v3);
}

TEST(ConfigDeepseek, BadInputsNameTheField) {
  json j = dsv3();
  j["scoring_func"] = "relu";
  expect_error(j, StatusCode::not_supported, {"scoring_func", "relu"});
  j = dsv3();
  j["topk_method"] = "aux_loss";
  expect_error(j, StatusCode::not_supported, {"topk_method", "aux_loss"});
  j = dsv3();
  j["rope_scaling"]["type"] = "linear";
  expect_error(j, StatusCode::not_supported, {"rope_scaling.type", "linear"});
  j = dsv3();
  j["rope_scaling"].erase("factor");
  expect_error(j, StatusCode::invalid_argument, {"rope_scaling.factor"});
  j = dsv3();
  j["rope_scaling"]["factor"] = 0.5;
  expect_error(j, StatusCode::invalid_argument, {"rope_scaling.factor"});
  j = dsv3();
  j["rope_scaling"] = "yarn";
  expect_error(j, StatusCode::invalid_argument, {"rope_scaling"});
  j = dsv3();
  j["n_group"] = 3;  // does not divide 16
  expect_error(j, StatusCode::invalid_argument, {"n_group"});
  j = dsv3();
  j["n_group"] = 16;  // noaux_tc needs >= 2 experts per group
  j["topk_group"] = 4;
  expect_error(j, StatusCode::invalid_argument, {"n_group"});
  j = dsv3();
  j["topk_group"] = 5;
  expect_error(j, StatusCode::invalid_argument, {"topk_group"});
  j = dsv3();
  j["num_experts_per_tok"] = 9;  // 2 groups of 4 kept: at most 8
  expect_error(j, StatusCode::invalid_argument, {"num_experts_per_tok"});
  j = dsv3();
  j["qk_rope_head_dim"] = 33;
  expect_error(j, StatusCode::invalid_argument, {"qk_rope_head_dim"});
  j = dsv3();
  j["kv_lora_rank"] = 0;
  expect_error(j, StatusCode::invalid_argument, {"kv_lora_rank"});
  j = dsv3();
  j["q_lora_rank"] = 0;
  expect_error(j, StatusCode::invalid_argument, {"q_lora_rank"});
  j = dsv3();
  j["v_head_dim"] = -1;
  expect_error(j, StatusCode::invalid_argument, {"v_head_dim"});
  j = dsv3();
  j["routed_scaling_factor"] = 0;
  expect_error(j, StatusCode::invalid_argument, {"routed_scaling_factor"});
  j = dsv3();
  j["moe_layer_freq"] = 0;
  expect_error(j, StatusCode::invalid_argument, {"moe_layer_freq"});
  j = dsv3();
  j["n_shared_experts"] = -2;
  expect_error(j, StatusCode::invalid_argument, {"n_shared_experts"});
  j = dsv3();
  j["rope_interleave"] = "yes";
  expect_error(j, StatusCode::invalid_argument, {"rope_interleave"});
  j = dsv3();
  j["scoring_func"] = 3;
  expect_error(j, StatusCode::invalid_argument, {"scoring_func"});
  j = dsv3();
  j["attention_bias"] = true;
  expect_error(j, StatusCode::not_supported, {"attention_bias"});
}

TEST(ConfigStep3, TextFields) {
  ModelConfig c = parse_ok(step3_text());
  EXPECT_EQ(c.arch, Arch::step3_text);
  EXPECT_EQ(c.attention, AttentionKind::gqa);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 192);
  EXPECT_EQ(c.q_dim(), 256);
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.n_experts_per_tok, 3);
  EXPECT_EQ(c.shared_expert_intermediate_size, 192);
  EXPECT_TRUE(c.shared_expert_ungated);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.scoring, RouterScoring::softmax);
  EXPECT_FALSE(c.rope_interleave);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  // "1,2": dense layers 0 and 3 (the trailing dense layer).
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  EXPECT_FALSE(c.is_moe_layer(3));
}

TEST(ConfigStep3, VlTextConfigAndOuterFields) {
  ModelConfig c = parse_ok(step3_vl(step3_text()));
  EXPECT_EQ(c.arch, Arch::step3_text);
  EXPECT_EQ(c.weight_quant, WeightQuant::fp8_block);  // from the top level
  EXPECT_EQ(c.bos_token_id, 3);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{4}));
  // The architectures name of the remote code, no model_type anywhere.
  json j = step3_vl(step3_text());
  j.erase("model_type");
  j["architectures"] = {"Step3vForConditionalGeneration"};
  j["text_config"].erase("model_type");
  j["text_config"].erase("architectures");
  EXPECT_EQ(parse_ok(j).arch, Arch::step3_text);
}

TEST(ConfigStep3, LayerEnumForms) {
  json j = step3_text();
  j["moe_layers_enum"] = " 0, 2 ";
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.moe_layers, (std::vector<int64_t>{0, 2}));
  j["moe_layers_enum"] = {1, 3};  // the class default is a tuple
  EXPECT_EQ(parse_ok(j).moe_layers, (std::vector<int64_t>{1, 3}));
  j.erase("moe_layers_enum");  // vLLM / SGLang: every layer but 0
  c = parse_ok(j);
  EXPECT_FALSE(c.is_moe_layer(0));
  for (int l = 1; l < 4; ++l) EXPECT_TRUE(c.is_moe_layer(l));
}

TEST(ConfigStep3, MaxPositionSingularOrPlural) {
  json j = step3_text();
  j.erase("max_position_embedding");
  EXPECT_EQ(parse_ok(j).max_position_embeddings, 65536);
  j["max_position_embeddings"] = 8192;
  EXPECT_EQ(parse_ok(j).max_position_embeddings, 8192);
  j["max_position_embedding"] = 4096;  // the config class's own spelling wins
  EXPECT_EQ(parse_ok(j).max_position_embeddings, 4096);
}

TEST(ConfigStep3, DefaultsAreTheModelCard) {
  ModelConfig c = parse_ok(json{{"model_type", "step3_text"}});
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.n_layers, 61);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.q_lora_rank, 2048);
  EXPECT_EQ(c.n_experts, 48);
  EXPECT_EQ(c.n_experts_per_tok, 3);
  EXPECT_EQ(c.max_position_embeddings, 65536);
}

TEST(ConfigStep3, BadInputsNameTheField) {
  json j = step3_text();
  j["num_attention_groups"] = 2;
  expect_error(j, StatusCode::not_supported, {"num_attention_groups"});
  for (const char* bad : {"1,x", "1,,2", "", "-1", "1;2", "99999999999"}) {
    j = step3_text();
    j["moe_layers_enum"] = bad;
    expect_error(j, StatusCode::invalid_argument, {"moe_layers_enum"});
  }
  j = step3_text();
  j["moe_layers_enum"] = "1,7";  // only 4 layers
  expect_error(j, StatusCode::invalid_argument, {"moe_layers_enum"});
  j = step3_text();
  j["moe_layers_enum"] = 5;
  expect_error(j, StatusCode::invalid_argument, {"moe_layers_enum"});
  j = step3_text();
  j["moe_top_k"] = 9;
  expect_error(j, StatusCode::invalid_argument, {"moe_top_k"});
  j = step3_text();
  j["moe_num_experts"] = 0;
  expect_error(j, StatusCode::invalid_argument, {"moe_num_experts"});
  j = step3_text();
  j["share_q_dim"] = 0;
  expect_error(j, StatusCode::invalid_argument, {"share_q_dim"});
  j = step3_text();
  j["head_dim"] = 63;
  expect_error(j, StatusCode::invalid_argument, {"head_dim"});
  j = step3_text();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
  expect_error(j, StatusCode::not_supported, {"rope_scaling"});
  j = step3_text();
  j["max_position_embedding"] = 0;
  expect_error(j, StatusCode::invalid_argument, {"max_position_embedding"});
  // step3_vl without a usable text_config.
  j = step3_vl(step3_text());
  j.erase("text_config");
  expect_error(j, StatusCode::invalid_argument, {"text_config"});
  j = step3_vl(step3_text());
  j["text_config"] = "x";
  expect_error(j, StatusCode::invalid_argument, {"text_config"});
  j = step3_vl(step3_text());
  j["text_config"]["model_type"] = "qwen3_moe";
  expect_error(j, StatusCode::invalid_argument, {"text_config", "model_type"});
  j = step3_vl(step3_text());
  j["text_config"]["moe_top_k"] = "3";
  expect_error(j, StatusCode::invalid_argument, {"text_config", "moe_top_k"});
}

TEST(ConfigFamilies, PresetsRoundTripThroughJsonWriter) {
  for (Arch a : {Arch::deepseek_v2, Arch::deepseek_v3, Arch::step3_text}) {
    for (const char* preset : {"tiny", "small", "bench"}) {
      for (DType dt : {DType::bf16, DType::f8_e4m3}) {
        auto c = make_preset_config(a, preset);
        ASSERT_TRUE(c.ok()) << arch_name(a) << " " << preset << ": " << c.status().to_string();
        if (dt == DType::f8_e4m3) c->weight_quant = WeightQuant::fp8_block;
        auto back = parse_model_config(model_config_to_json(*c, dt));
        ASSERT_TRUE(back.ok()) << arch_name(a) << " " << preset << ": " << back.status().to_string();
        EXPECT_EQ(back->arch, a);
        EXPECT_EQ(back->attention, c->attention);
        EXPECT_EQ(back->n_experts, c->n_experts);
        EXPECT_EQ(back->q_lora_rank, c->q_lora_rank);
        EXPECT_EQ(back->kv_lora_rank, c->kv_lora_rank);
        EXPECT_EQ(back->head_dim, c->head_dim);
        EXPECT_EQ(back->shared_expert_intermediate_size, c->shared_expert_intermediate_size);
        EXPECT_EQ(back->topk_method, c->topk_method);
        EXPECT_EQ(back->scoring, c->scoring);
        EXPECT_EQ(back->n_group, c->n_group);
        EXPECT_DOUBLE_EQ(back->routed_scaling_factor, c->routed_scaling_factor);
        EXPECT_EQ(back->rope_scaling.type, c->rope_scaling.type);
        EXPECT_DOUBLE_EQ(back->rope_scaling.mscale, c->rope_scaling.mscale);
        EXPECT_EQ(back->weight_quant, c->weight_quant);
        for (int64_t l = 0; l < c->n_layers; ++l) EXPECT_EQ(back->is_moe_layer(l), c->is_moe_layer(l)) << l;
      }
    }
  }
}

}  // namespace
}  // namespace afd::test_config_families
