// load_model for the DeepSeek (MLA) and Step-3 (MFA) families: make_model'd tiny checkpoints
// bind every tensor with the written values and shapes (Step-3's stacked 3-D experts as
// per-expert views, FP8 with stacked scales), DeepSeek MTP layers are ignored, and lying
// checkpoints fail with errors that name the tensor and the config field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "checkpoint_rewrite.h"
#include "model/checkpoint.h"
#include "model/tools/make_model.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace afd::test_load_families {
namespace {

using test::rewrite_checkpoint;

float at(const Matrix& m, int64_t r, int64_t c) {
  std::vector<float> row(static_cast<size_t>(m.cols));
  matrix_row_f32(m, r, row.data());
  return row[static_cast<size_t>(c)];
}

// Every element of bf16 matrix `m` equals make_model's value for logical tensor `name`.
void expect_values(const Matrix& m, const ModelConfig& c, const std::string& name) {
  ASSERT_EQ(m.dtype, DType::bf16) << name;
  std::vector<float> want = make_model_tensor_values(c, 1, name);
  ASSERT_EQ(static_cast<int64_t>(want.size()), m.rows * m.cols) << name;
  std::vector<float> row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    matrix_row_f32(m, r, row.data());
    for (int64_t k = 0; k < m.cols; ++k)
      ASSERT_EQ(row[k], round_bf16(want[static_cast<size_t>(r * m.cols + k)])) << name << " [" << r << ", " << k << "]";
  }
}

void expect_shape(const Matrix& m, int64_t rows, int64_t cols, const char* what) {
  EXPECT_FALSE(m.empty()) << what;
  EXPECT_EQ(m.rows, rows) << what;
  EXPECT_EQ(m.cols, cols) << what;
}

ModelConfig preset(Arch a) {
  auto c = make_preset_config(a, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

void make(const ModelConfig& c, const std::string& dir, DType dt) {
  MakeModelOptions o;
  o.out_dir = dir;
  o.dtype = dt;
  auto r = make_model(c, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& f) {
  std::ifstream in(dir + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  f(j);
  std::ofstream(dir + "/config.json", std::ios::trunc) << j.dump(2);
}

void expect_load_error(const std::string& dir, StatusCode code, std::initializer_list<const char*> wants) {
  auto w = load_model(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), code) << w.status().to_string();
  for (const char* want : wants)
    EXPECT_NE(w.status().message().find(want), std::string::npos)
        << "want '" << want << "' in: " << w.status().to_string();
}

TEST(LoadStep3, EveryTensorBoundWithWrittenValues) {
  test::TempDir d;
  const ModelConfig c = preset(Arch::step3_text);
  make(c, d.path(), DType::bf16);
  auto loaded = load_model(d.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const ModelWeights& w = **loaded;
  EXPECT_EQ(w.config.arch, Arch::step3_text);
  const int64_t H = c.hidden_size, R = c.q_lora_rank, I = c.moe_intermediate_size;
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), 4);
  for (int64_t l = 0; l < 4; ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expect_shape(L.attn.q_a, R, H, "q_proj");
    EXPECT_EQ(L.attn.q_a_norm.n, R);
    expect_shape(L.attn.q, c.n_heads * c.head_dim, R, "wq");
    expect_shape(L.attn.k, c.head_dim, H, "k_proj");
    expect_shape(L.attn.v, c.head_dim, H, "v_proj");
    expect_shape(L.attn.o, H, c.n_heads * c.head_dim, "o_proj");
    EXPECT_TRUE(L.attn.kv_a.empty());
    expect_values(L.attn.q_a, c, p + "self_attn.q_proj.weight");
    expect_values(L.attn.q, c, p + "self_attn.wq.weight");
    EXPECT_EQ(L.is_moe, l == 1 || l == 2) << l;  // moe_layers_enum "1,2"
    if (!L.is_moe) {
      expect_shape(L.dense.gate, c.intermediate_size, H, "mlp.gate_proj");
      expect_values(L.dense.down, c, p + "mlp.down_proj.weight");
      continue;
    }
    expect_shape(L.moe.router, c.n_experts, H, "moe.gate");
    EXPECT_TRUE(L.moe.shared_gate.empty());
    EXPECT_TRUE(L.moe.score_bias.empty());
    ASSERT_EQ(static_cast<int64_t>(L.moe.experts.size()), c.n_experts);
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const FfnWeights& f = L.moe.experts[e];
      expect_shape(f.gate, I, H, "expert gate");
      expect_shape(f.down, H, I, "expert down");
      const std::string ep = p + "moe.experts." + std::to_string(e) + ".";
      expect_values(f.gate, c, ep + "gate_proj.weight");
      expect_values(f.up, c, ep + "up_proj.weight");
      expect_values(f.down, c, ep + "down_proj.weight");
    }
    expect_shape(L.moe.shared.gate, c.shared_expert_intermediate_size, H, "share_expert.gate_proj");
    expect_values(L.moe.shared.down, c, p + "share_expert.down_proj.weight");
  }
}

TEST(LoadStep3, Fp8StackedExpertsAreViewsWithTheirScaleSlabs) {
  test::TempDir d;
  const ModelConfig c = preset(Arch::step3_text);
  make(c, d.path(), DType::f8_e4m3);
  auto loaded = load_model(d.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const ModelWeights& w = **loaded;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  const std::string p = "model.layers.1.moe.";
  const TensorRef* g = w.checkpoint->find(p + "gate_proj.weight");
  const TensorRef* gs = w.checkpoint->find(p + "gate_proj.weight_scale_inv");
  const TensorRef* dn = w.checkpoint->find(p + "down_proj.weight");
  const TensorRef* ds = w.checkpoint->find(p + "down_proj.weight_scale_inv");
  ASSERT_TRUE(g && gs && dn && ds);
  EXPECT_EQ(gs->info->shape, (std::vector<int64_t>{c.n_experts, 2, 2}));  // [8, ceil(160/128), ceil(256/128)]
  EXPECT_EQ(ds->info->shape, (std::vector<int64_t>{c.n_experts, 2, 2}));  // [8, ceil(256/128), ceil(160/128)]
  EXPECT_EQ(w.layers[1].moe.router.dtype, DType::bf16);                   // routers stay bf16
  for (int64_t e = 0; e < c.n_experts; ++e) {
    const FfnWeights& f = w.layers[1].moe.experts[e];
    ASSERT_TRUE(f.gate.is_fp8());
    EXPECT_EQ(f.gate.data, g->data + e * I * H);
    EXPECT_EQ(f.gate.scale, reinterpret_cast<const float*>(gs->data) + e * 4);
    EXPECT_EQ(f.gate.scale_stride, 2);
    EXPECT_EQ(f.down.data, dn->data + e * H * I);
    EXPECT_EQ(f.down.scale, reinterpret_cast<const float*>(ds->data) + e * 4);
  }
  // Dequantized FP8 is close to the bf16 checkpoint of the same seed (e4m3: 3 mantissa bits).
  test::TempDir d16("afd_model_step3_bf16_twin");
  make(c, d16.path(), DType::bf16);
  auto twin = load_model(d16.path());
  ASSERT_TRUE(twin.ok());
  const Matrix& a = w.layers[2].moe.experts[5].down;
  const Matrix& b = (*twin)->layers[2].moe.experts[5].down;
  for (int64_t r = 0; r < H; r += 37)
    for (int64_t k = 0; k < I; k += 11) EXPECT_NEAR(at(a, r, k), at(b, r, k), 0.07 * std::fabs(at(b, r, k)) + 2e-3);
}

struct DsCase {
  Arch arch;
  DType dtype;
};

class LoadDeepseek : public ::testing::TestWithParam<DsCase> {};

TEST_P(LoadDeepseek, EveryTensorBound) {
  const DsCase k = GetParam();
  test::TempDir d;
  const ModelConfig c = preset(k.arch);
  make(c, d.path(), k.dtype);
  auto loaded = load_model(d.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const ModelWeights& w = **loaded;
  EXPECT_EQ(w.config.attention, AttentionKind::mla);
  const int64_t H = c.hidden_size, N = c.n_heads;
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (c.q_lora_rank > 0) {
      expect_shape(L.attn.q_a, c.q_lora_rank, H, "q_a_proj");
      EXPECT_EQ(L.attn.q_a_norm.n, c.q_lora_rank);
      expect_shape(L.attn.q, N * c.qk_head_dim(), c.q_lora_rank, "q_b_proj");
    } else {
      EXPECT_TRUE(L.attn.q_a.empty());
      expect_shape(L.attn.q, N * c.qk_head_dim(), H, "q_proj");
    }
    expect_shape(L.attn.kv_a, c.kv_lora_rank + c.qk_rope_head_dim, H, "kv_a_proj_with_mqa");
    EXPECT_EQ(L.attn.kv_a_norm.n, c.kv_lora_rank);
    expect_shape(L.attn.kv_b, N * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, "kv_b_proj");
    expect_shape(L.attn.o, H, N * c.v_head_dim, "o_proj");
    EXPECT_TRUE(L.attn.k.empty());
    EXPECT_EQ(L.attn.kv_a.is_fp8(), k.dtype == DType::f8_e4m3);
    if (k.dtype == DType::bf16) {
      expect_values(L.attn.kv_a, c, p + "self_attn.kv_a_proj_with_mqa.weight");
      expect_values(L.attn.kv_b, c, p + "self_attn.kv_b_proj.weight");
    }
    EXPECT_EQ(L.is_moe, l >= 1);  // first_k_dense_replace 1
    if (!L.is_moe) {
      expect_shape(L.dense.gate, c.intermediate_size, H, "mlp.gate_proj");
      continue;
    }
    EXPECT_EQ(L.moe.router.dtype, DType::bf16);
    ASSERT_EQ(static_cast<int64_t>(L.moe.experts.size()), c.n_experts);
    expect_shape(L.moe.experts[c.n_experts - 1].down, H, c.moe_intermediate_size, "expert down");
    expect_shape(L.moe.shared.gate, c.n_shared_experts * c.moe_intermediate_size, H, "shared_experts.gate_proj");
    EXPECT_TRUE(L.moe.shared_gate.empty());
    if (c.has_score_bias) {
      // Written as float32: bound exactly.
      std::vector<float> want = make_model_tensor_values(c, 1, p + "mlp.gate.e_score_correction_bias");
      ASSERT_EQ(L.moe.score_bias.n, c.n_experts);
      for (int64_t e = 0; e < c.n_experts; ++e) EXPECT_EQ(L.moe.score_bias.data[e], want[e]);
    } else {
      EXPECT_TRUE(L.moe.score_bias.empty());
    }
  }
  EXPECT_GT(w.matrix_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, LoadDeepseek,
    ::testing::Values(DsCase{Arch::deepseek_v3, DType::bf16}, DsCase{Arch::deepseek_v3, DType::f8_e4m3},
                      DsCase{Arch::deepseek_v2, DType::bf16}, DsCase{Arch::deepseek_v2, DType::f8_e4m3}),
    [](const auto& i) { return std::string(arch_name(i.param.arch)) + "_" + dtype_name(i.param.dtype); });

TEST(LoadDeepseekMtp, LayersAfterNumHiddenLayersAreIgnored) {
  test::TempDir d;
  ModelConfig c = preset(Arch::deepseek_v3);
  c.num_nextn_predict_layers = 1;
  make(c, d.path(), DType::bf16);
  const std::string m = "model.layers." + std::to_string(c.n_layers) + ".";
  rewrite_checkpoint(d.path(), [](TensorSpec&, std::vector<uint8_t>&) { return true; },
                     {{m + "eh_proj.weight", DType::bf16, {c.hidden_size, 2 * c.hidden_size}},
                      {m + "enorm.weight", DType::bf16, {c.hidden_size}},
                      {m + "self_attn.kv_b_proj.weight", DType::bf16, {3, 3}}});
  auto loaded = load_model(d.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(static_cast<int64_t>((*loaded)->layers.size()), c.n_layers);
  EXPECT_EQ((*loaded)->config.num_nextn_predict_layers, 1);
}

TEST(LoadDeepseekMtp, GoldenCheckpointWithMtpLayerLoads) {
  const std::string dir = std::string(AFD_SOURCE_DIR) + "/tests/reference/data/dsv3_tiny_fp8";
  auto loaded = load_model(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const ModelWeights& w = **loaded;
  EXPECT_EQ(w.config.num_nextn_predict_layers, 1);
  EXPECT_EQ(static_cast<int64_t>(w.layers.size()), w.config.n_layers);
  // The MTP layer is on disk (and not bound).
  bool mtp_on_disk = false;
  const std::string m = "model.layers." + std::to_string(w.config.n_layers) + ".";
  for (const std::string& n : w.checkpoint->tensor_names()) mtp_on_disk |= n.rfind(m, 0) == 0;
  EXPECT_TRUE(mtp_on_disk);
}

TEST(LoadDeepseek, ScoreBiasInBf16IsWidened) {
  test::TempDir d;
  const ModelConfig c = preset(Arch::deepseek_v3);
  make(c, d.path(), DType::bf16);
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  rewrite_checkpoint(d.path(), [&](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name != bias) return true;
    std::vector<uint8_t> out(b.size() / 2);
    for (size_t i = 0; i < b.size() / 4; ++i) {
      float f;
      std::memcpy(&f, &b[4 * i], 4);
      const uint16_t h = f32_to_bf16(f).bits;
      std::memcpy(&out[2 * i], &h, 2);
    }
    b = out;
    s.dtype = DType::bf16;
    return true;
  });
  auto loaded = load_model(d.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  std::vector<float> want = make_model_tensor_values(c, 1, bias);
  for (int64_t e = 0; e < c.n_experts; ++e) EXPECT_EQ((*loaded)->layers[1].moe.score_bias.data[e], round_bf16(want[e]));
}

TEST(LoadFamiliesErrors, MissingScoreBiasNamesIt) {
  test::TempDir d;
  make(preset(Arch::deepseek_v3), d.path(), DType::bf16);
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>&) {
    return s.name != "model.layers.2.mlp.gate.e_score_correction_bias";
  });
  expect_load_error(d.path(), StatusCode::not_found,
                    {"model.layers.2.mlp.gate.e_score_correction_bias", "n_routed_experts"});
}

TEST(LoadFamiliesErrors, KvAShapeNamesTheFields) {
  test::TempDir d;
  make(preset(Arch::deepseek_v3), d.path(), DType::bf16);
  edit_config(d.path(), [](nlohmann::json& j) {
    j["qk_rope_head_dim"] = 16;
    j["qk_nope_head_dim"] = 80;
  });
  expect_load_error(d.path(), StatusCode::invalid_argument,
                    {"model.safetensors", "kv_a_proj_with_mqa.weight", "kv_lora_rank+qk_rope_head_dim"});
}

TEST(LoadFamiliesErrors, DirectQueryConfigAgainstLowRankCheckpoint) {
  test::TempDir d;
  make(preset(Arch::deepseek_v3), d.path(), DType::bf16);
  edit_config(d.path(), [](nlohmann::json& j) { j["q_lora_rank"] = nullptr; });
  expect_load_error(d.path(), StatusCode::not_found, {"self_attn.q_proj.weight", "missing"});
}

TEST(LoadFamiliesErrors, Step3StackedScaleMissing) {
  test::TempDir d;
  make(preset(Arch::step3_text), d.path(), DType::f8_e4m3);
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>&) {
    return s.name != "model.layers.2.moe.up_proj.weight_scale_inv";
  });
  expect_load_error(d.path(), StatusCode::not_found, {"model.layers.2.moe.up_proj.weight_scale_inv", "block scales"});
}

TEST(LoadFamiliesErrors, Step3StackedScaleWrongShape) {
  test::TempDir d;
  make(preset(Arch::step3_text), d.path(), DType::f8_e4m3);
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>&) {
    if (s.name == "model.layers.1.moe.down_proj.weight_scale_inv") s.shape = {8, 4, 1};  // same count
    return true;
  });
  expect_load_error(d.path(), StatusCode::invalid_argument,
                    {"model.layers.1.moe.down_proj.weight_scale_inv", "[8, 4, 1]", "moe_num_experts"});
}

TEST(LoadFamiliesErrors, Step3StackedExpertsWrongShape) {
  test::TempDir d;
  make(preset(Arch::step3_text), d.path(), DType::bf16);
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>&) {
    if (s.name == "model.layers.1.moe.gate_proj.weight") s.shape = {4, 320, 256};  // same count
    return true;
  });
  expect_load_error(d.path(), StatusCode::invalid_argument,
                    {"model.layers.1.moe.gate_proj.weight", "moe_num_experts=8", "moe_intermediate_size=160"});
}

TEST(LoadFamiliesErrors, Fp8WithoutQuantizationConfig) {
  test::TempDir d;
  make(preset(Arch::step3_text), d.path(), DType::f8_e4m3);
  edit_config(d.path(), [](nlohmann::json& j) { j.erase("quantization_config"); });
  expect_load_error(d.path(), StatusCode::invalid_argument, {"F8_E4M3", "quantization_config"});
}

TEST(LoadFamiliesErrors, Step3MissingInterNorm) {
  test::TempDir d;
  make(preset(Arch::step3_text), d.path(), DType::bf16);
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>&) {
    return s.name != "model.layers.3.self_attn.inter_norm.weight";
  });
  expect_load_error(d.path(), StatusCode::not_found, {"model.layers.3.self_attn.inter_norm.weight", "share_q_dim"});
}

}  // namespace
}  // namespace afd::test_load_families
