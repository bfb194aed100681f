// config.json parsing: HF field names, defaults per architecture, and errors naming fields.
#include "model/config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tools/make_model.h"
#include "model_test_util.h"

namespace afd::test_config {
namespace {

using json = nlohmann::json;

json qwen3() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": false, "max_position_embeddings": 40960, "hidden_act": "silu",
    "rope_scaling": null, "use_sliding_window": false, "sliding_window": null,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2})");
}

void expect_field_error(const json& j, StatusCode code, std::initializer_list<const char*> needles) {
  auto r = parse_model_config(j.dump(), "dir/config.json");
  ASSERT_FALSE(r.ok()) << "accepted " << j.dump();
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find("dir/config.json"), std::string::npos) << r.status().message();
  for (const char* n : needles) EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
}

TEST(Config, Qwen3Fields) {
  auto r = parse_model_config(qwen3().dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Arch::qwen3_moe);
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.n_layers, 3);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.q_dim(), 256);
  EXPECT_EQ(c.kv_dim(), 64);
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.shared_expert_intermediate_size, 0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2}));
  for (int64_t l = 0; l < 3; ++l) EXPECT_TRUE(c.is_moe_layer(l));
}

TEST(Config, DefaultsWhenAbsent) {
  json j = qwen3();
  for (const char* k : {"num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "norm_topk_prob"}) j.erase(k);
  auto r = parse_model_config(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->n_kv_heads, 8);
  EXPECT_EQ(r->head_dim, 8);
  EXPECT_DOUBLE_EQ(r->rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(r->rms_norm_eps, 1e-6);
  EXPECT_FALSE(r->norm_topk_prob);
}

TEST(Config, SparseStepAndMlpOnlyLayers) {
  json j = qwen3();
  j["num_hidden_layers"] = 4;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  auto r = parse_model_config(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->is_moe_layer(0));
  EXPECT_TRUE(r->is_moe_layer(1));
  EXPECT_FALSE(r->is_moe_layer(2));
  EXPECT_FALSE(r->is_moe_layer(3));  // (3+1) % 2 == 0 but listed in mlp_only_layers
}

TEST(Config, DenseLayersNeedIntermediateSize) {
  json j = qwen3();
  j.erase("intermediate_size");
  j["mlp_only_layers"] = {0};
  expect_field_error(j, StatusCode::invalid_argument, {"intermediate_size"});
}

TEST(Config, MissingRequiredField) {
  for (const char* k : {"hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_experts",
                        "num_experts_per_tok", "moe_intermediate_size"}) {
    json j = qwen3();
    j.erase(k);
    expect_field_error(j, StatusCode::invalid_argument, {k, "missing"});
  }
}

TEST(Config, WrongTypes) {
  json j = qwen3();
  j["hidden_size"] = "64";
  expect_field_error(j, StatusCode::invalid_argument, {"hidden_size", "integer"});
  j = qwen3();
  j["num_experts"] = 8.5;
  expect_field_error(j, StatusCode::invalid_argument, {"num_experts"});
  j = qwen3();
  j["tie_word_embeddings"] = "yes";
  expect_field_error(j, StatusCode::invalid_argument, {"tie_word_embeddings"});
  j = qwen3();
  j["eos_token_id"] = {1, "x"};
  expect_field_error(j, StatusCode::invalid_argument, {"eos_token_id"});
}

TEST(Config, InconsistentSizes) {
  json j = qwen3();
  j["num_key_value_heads"] = 3;
  expect_field_error(j, StatusCode::invalid_argument, {"num_key_value_heads"});
  j = qwen3();
  j["num_experts_per_tok"] = 9;
  expect_field_error(j, StatusCode::invalid_argument, {"num_experts_per_tok"});
  j = qwen3();
  j["hidden_size"] = -64;
  expect_field_error(j, StatusCode::invalid_argument, {"hidden_size"});
  j = qwen3();
  j["mlp_only_layers"] = {7};
  expect_field_error(j, StatusCode::invalid_argument, {"mlp_only_layers"});
  j = qwen3();
  j["eos_token_id"] = 5000;
  expect_field_error(j, StatusCode::invalid_argument, {"eos_token_id"});
}

TEST(Config, UnknownArchitecture) {
  json j = qwen3();
  j["model_type"] = "llama";
  expect_field_error(j, StatusCode::not_supported, {"model_type", "llama"});
  j.erase("model_type");
  j["architectures"] = {"LlamaForCausalLM"};
  expect_field_error(j, StatusCode::not_supported, {"LlamaForCausalLM"});
  j.erase("architectures");
  expect_field_error(j, StatusCode::invalid_argument, {"model_type", "missing"});
}

TEST(Config, ArchitectureInferredWithoutModelType) {
  json j = qwen3();
  j.erase("model_type");
  auto r = parse_model_config(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->arch, Arch::qwen3_moe);
  EXPECT_EQ(r->model_type, "qwen3_moe");
}

TEST(Config, UnsupportedFeatures) {
  json j = qwen3();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  expect_field_error(j, StatusCode::not_supported, {"rope_scaling"});
  j = qwen3();
  j["hidden_act"] = "gelu";
  expect_field_error(j, StatusCode::not_supported, {"hidden_act"});
  j = qwen3();
  j["use_sliding_window"] = true;
  expect_field_error(j, StatusCode::not_supported, {"use_sliding_window"});
}

TEST(Config, NotJson) {
  auto r = parse_model_config("{\"hidden_size\": ", "x/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x/config.json"), std::string::npos);
}

TEST(Config, Qwen2MoeSharedExpert) {
  json j = qwen3();
  j["model_type"] = "qwen2_moe";
  j.erase("head_dim");
  expect_field_error(j, StatusCode::invalid_argument, {"shared_expert_intermediate_size"});
  j["shared_expert_intermediate_size"] = 96;
  auto r = parse_model_config(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->arch, Arch::qwen2_moe);
  EXPECT_EQ(r->shared_expert_intermediate_size, 96);
  EXPECT_TRUE(r->attention_bias);
  EXPECT_FALSE(r->qk_norm);
}

TEST(Config, MixtralFieldNames) {
  json j = json::parse(R"({"architectures":["MixtralForCausalLM"],"model_type":"mixtral","vocab_size":500,
    "hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,
    "num_key_value_heads":1,"num_local_experts":4,"num_experts_per_tok":2,"sliding_window":null})");
  auto r = parse_model_config(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->arch, Arch::mixtral);
  EXPECT_EQ(r->n_experts, 4);
  EXPECT_EQ(r->moe_intermediate_size, 96);
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_DOUBLE_EQ(r->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(r->rms_norm_eps, 1e-5);
  EXPECT_EQ(r->head_dim, 16);
  EXPECT_EQ(r->sliding_window, 0);
  j.erase("num_local_experts");
  expect_field_error(j, StatusCode::invalid_argument, {"num_local_experts"});
}

TEST(Config, RoundTripThroughJsonWriter) {
  for (Arch a : {Arch::qwen3_moe, Arch::qwen2_moe, Arch::mixtral}) {
    auto c = make_preset_config(a, "tiny");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    c->tie_word_embeddings = true;
    auto r = parse_model_config(model_config_to_json(*c, DType::bf16));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->arch, a);
    EXPECT_EQ(r->hidden_size, c->hidden_size);
    EXPECT_EQ(r->n_kv_heads, c->n_kv_heads);
    EXPECT_EQ(r->head_dim, c->head_dim);
    EXPECT_EQ(r->n_experts, c->n_experts);
    EXPECT_EQ(r->moe_intermediate_size, c->moe_intermediate_size);
    EXPECT_EQ(r->shared_expert_intermediate_size, c->shared_expert_intermediate_size);
    EXPECT_EQ(r->norm_topk_prob, c->norm_topk_prob);
    EXPECT_EQ(r->tie_word_embeddings, true);
    EXPECT_EQ(r->eos_token_ids, c->eos_token_ids);
    EXPECT_EQ(r->torch_dtype, "bfloat16");
  }
}

TEST(Config, LoadFromDirectoryWithGenerationConfig) {
  test::TempDir d;
  test::write_bytes(d.file("config.json"), qwen3().dump());
  test::write_bytes(d.file("generation_config.json"), R"({"eos_token_id": [2, 7], "bos_token_id": 1})");
  auto r = load_model_config(d.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{2, 7}));
  test::write_bytes(d.file("generation_config.json"), R"({"eos_token_id": "x"})");
  r = load_model_config(d.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("generation_config.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("eos_token_id"), std::string::npos);
}

TEST(Config, MissingConfigFileNamesPath) {
  test::TempDir d;
  auto r = load_model_config(d.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::not_found);
  EXPECT_NE(r.status().message().find(d.file("config.json")), std::string::npos);
}

}  // namespace
}  // namespace afd::test_config
