// make_model -> load_model round trips (every arch, expert layout, dtype, single/sharded),
// and load_model's errors on checkpoints that lie.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/tools/make_model.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace afd::test_load_model {
namespace {

float round_to(DType t, float v) {
  switch (t) {
    case DType::bf16: return round_bf16(v);
    case DType::f16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}

float matrix_at(const Matrix& m, int64_t i) {
  if (m.dtype == DType::bf16) {
    uint16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(m.data) + 2 * i, 2);
    return bf16_to_f32(h);
  }
  return static_cast<const float*>(m.data)[i];
}

// Every element of `m` equals make_model's value for `name`, rounded through the file dtype.
void expect_matrix_values(const Matrix& m, const ModelConfig& c, const std::string& name, DType file_dtype) {
  std::vector<float> want = make_model_tensor_values(c, 1, name);
  ASSERT_EQ(static_cast<int64_t>(want.size()), m.rows * m.cols) << name;
  for (int64_t i = 0; i < m.rows * m.cols; ++i) {
    ASSERT_EQ(matrix_at(m, i), round_to(file_dtype, want[static_cast<size_t>(i)])) << name << " [" << i << "]";
  }
}

void expect_vector_values(const Vector& v, const ModelConfig& c, const std::string& name, DType file_dtype) {
  std::vector<float> want = make_model_tensor_values(c, 1, name);
  ASSERT_EQ(static_cast<int64_t>(want.size()), v.n) << name;
  for (int64_t i = 0; i < v.n; ++i) ASSERT_EQ(v.data[i], round_to(file_dtype, want[static_cast<size_t>(i)])) << name;
}

void expect_shape(const Matrix& m, int64_t rows, int64_t cols, DType dtype, const char* what) {
  EXPECT_FALSE(m.empty()) << what;
  EXPECT_EQ(m.rows, rows) << what;
  EXPECT_EQ(m.cols, cols) << what;
  EXPECT_EQ(m.dtype, dtype) << what;
}

struct Case {
  Arch arch;
  ExpertLayout layout;
  DType dtype;
  bool sharded;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  return std::string(arch_name(p.param.arch)) + (p.param.layout == ExpertLayout::fused ? "_fused_" : "_per_expert_") +
         dtype_name(p.param.dtype) + (p.param.sharded ? "_sharded" : "_single");
}

class RoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTrip, EveryTensorBoundWithWrittenValues) {
  const Case k = GetParam();
  test::TempDir dir;
  auto cfg = make_preset_config(k.arch, "tiny");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const ModelConfig& c = *cfg;
  MakeModelOptions opt;
  opt.out_dir = dir.path();
  opt.dtype = k.dtype;
  opt.layout = k.layout;
  opt.shard_size = k.sharded ? 60000 : opt.shard_size;
  auto rep = make_model(c, opt);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(std::filesystem::exists(dir.file("model.safetensors.index.json")), k.sharded);
  EXPECT_EQ(std::filesystem::exists(dir.file("model.safetensors")), !k.sharded);

  auto loaded = load_model(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const ModelWeights& w = **loaded;
  if (k.sharded) {
    EXPECT_GT(w.checkpoint->files().size(), 2u);
  }
  EXPECT_EQ(w.config.arch, k.arch);
  EXPECT_EQ(static_cast<uint64_t>(w.checkpoint->total_bytes()), rep->tensor_bytes);
  const DType mem = k.dtype == DType::bf16 ? DType::bf16 : DType::f32;  // f16 is converted to f32
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.moe_intermediate_size;

  expect_shape(w.embed, V, H, mem, "embed");
  expect_shape(w.lm_head, V, H, mem, "lm_head");
  EXPECT_NE(w.lm_head.data, w.embed.data);
  EXPECT_EQ(w.final_norm.n, H);
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), c.n_layers);
  for (const LayerWeights& L : w.layers) {
    EXPECT_EQ(L.input_norm.n, H);
    EXPECT_EQ(L.post_attention_norm.n, H);
    expect_shape(L.attn.q, c.q_dim(), H, mem, "q");
    expect_shape(L.attn.k, c.kv_dim(), H, mem, "k");
    expect_shape(L.attn.v, c.kv_dim(), H, mem, "v");
    expect_shape(L.attn.o, H, c.q_dim(), mem, "o");
    EXPECT_EQ(L.attn.q_norm.n, c.qk_norm ? c.head_dim : 0);
    EXPECT_EQ(L.attn.k_norm.n, c.qk_norm ? c.head_dim : 0);
    EXPECT_EQ(L.attn.q_bias.n, c.attention_bias ? c.q_dim() : 0);
    EXPECT_EQ(L.attn.v_bias.n, c.attention_bias ? c.kv_dim() : 0);
    ASSERT_TRUE(L.is_moe);
    expect_shape(L.moe.router, c.n_experts, H, mem, "router");
    ASSERT_EQ(static_cast<int64_t>(L.moe.experts.size()), c.n_experts);
    for (const FfnWeights& e : L.moe.experts) {
      expect_shape(e.gate, I, H, mem, "gate");
      expect_shape(e.up, I, H, mem, "up");
      expect_shape(e.down, H, I, mem, "down");
    }
    if (c.shared_expert_intermediate_size > 0) {
      expect_shape(L.moe.shared.gate, c.shared_expert_intermediate_size, H, mem, "shared gate");
      expect_shape(L.moe.shared.down, H, c.shared_expert_intermediate_size, mem, "shared down");
      expect_shape(L.moe.shared_gate, 1, H, mem, "shared_expert_gate");
    } else {
      EXPECT_TRUE(L.moe.shared.gate.empty());
      EXPECT_TRUE(L.moe.shared_gate.empty());
    }
  }

  // Values: what make_model drew for each logical (per-expert) tensor.
  const bool mx = k.arch == Arch::mixtral;
  const std::string l1 = "model.layers.1.";
  const std::string moe = l1 + (mx ? "block_sparse_moe." : "mlp.");
  const LayerWeights& L1 = w.layers[1];
  expect_matrix_values(w.embed, c, "model.embed_tokens.weight", k.dtype);
  expect_matrix_values(w.lm_head, c, "lm_head.weight", k.dtype);
  expect_vector_values(w.final_norm, c, "model.norm.weight", k.dtype);
  expect_vector_values(L1.input_norm, c, l1 + "input_layernorm.weight", k.dtype);
  expect_matrix_values(L1.attn.k, c, l1 + "self_attn.k_proj.weight", k.dtype);
  expect_matrix_values(L1.attn.o, c, l1 + "self_attn.o_proj.weight", k.dtype);
  expect_matrix_values(L1.moe.router, c, moe + "gate.weight", k.dtype);
  for (int e : {0, 3, 7}) {
    const std::string ep = moe + "experts." + std::to_string(e) + ".";
    const FfnWeights& f = L1.moe.experts[static_cast<size_t>(e)];
    expect_matrix_values(f.gate, c, ep + (mx ? "w1.weight" : "gate_proj.weight"), k.dtype);
    expect_matrix_values(f.up, c, ep + (mx ? "w3.weight" : "up_proj.weight"), k.dtype);
    expect_matrix_values(f.down, c, ep + (mx ? "w2.weight" : "down_proj.weight"), k.dtype);
  }
  if (c.qk_norm) expect_vector_values(L1.attn.k_norm, c, l1 + "self_attn.k_norm.weight", k.dtype);
  if (c.attention_bias) expect_vector_values(L1.attn.q_bias, c, l1 + "self_attn.q_proj.bias", k.dtype);
  if (c.shared_expert_intermediate_size > 0) {
    expect_matrix_values(L1.moe.shared.up, c, moe + "shared_expert.up_proj.weight", k.dtype);
    expect_matrix_values(L1.moe.shared_gate, c, moe + "shared_expert_gate.weight", k.dtype);
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (Arch a : {Arch::qwen3_moe, Arch::qwen2_moe, Arch::mixtral})
    for (ExpertLayout l : {ExpertLayout::per_expert, ExpertLayout::fused})
      for (DType t : {DType::bf16, DType::f16, DType::f32})
        for (bool s : {false, true}) out.push_back({a, l, t, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Model, RoundTrip, ::testing::ValuesIn(all_cases()), case_name);

// A tiny qwen3_moe checkpoint written into a temp dir, for the error tests.
class LoadErrors : public ::testing::Test {
 protected:
  void SetUp() override { write(ExpertLayout::per_expert); }
  void write(ExpertLayout layout, DType dtype = DType::f32) {
    auto c = make_preset_config(Arch::qwen3_moe, "tiny");
    ASSERT_TRUE(c.ok());
    config = *c;
    MakeModelOptions opt;
    opt.out_dir = dir.path();
    opt.dtype = dtype;
    opt.layout = layout;
    ASSERT_TRUE(make_model(config, opt).ok());
  }
  // load_model fails with `code` and a message containing every needle.
  void expect_error(StatusCode code, std::initializer_list<std::string> needles) {
    auto r = load_model(dir.path());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    for (const auto& n : needles) EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
  }
  void edit_config(const std::function<void(nlohmann::json&)>& f) {
    auto j = nlohmann::json::parse(test::read_bytes(dir.file("config.json")));
    f(j);
    test::write_bytes(dir.file("config.json"), j.dump());
  }
  std::string st() const { return dir.file("model.safetensors"); }

  test::TempDir dir;
  ModelConfig config;
};

TEST_F(LoadErrors, MissingTensor) {
  const std::string t = "model.layers.1.mlp.experts.5.up_proj.weight";
  test::edit_safetensors_header(st(), [&](nlohmann::ordered_json& h) { h.erase(t); });
  expect_error(StatusCode::not_found, {"'" + t + "'", dir.path()});
}

TEST_F(LoadErrors, HeaderShapeDisagreesWithConfig) {
  const std::string t = "model.layers.0.self_attn.q_proj.weight";
  test::edit_safetensors_header(st(), [&](nlohmann::ordered_json& h) { h[t]["shape"] = {32, 128}; });
  expect_error(StatusCode::invalid_argument, {"'" + t + "'", "[32, 128]", "num_attention_heads*head_dim=64", st()});
}

TEST_F(LoadErrors, ConfigDisagreesWithTensors) {
  edit_config([](nlohmann::json& j) { j["moe_intermediate_size"] = 16; });
  expect_error(StatusCode::invalid_argument, {"model.layers.0.mlp.experts.0.gate_proj.weight", "moe_intermediate_size=16"});
}

TEST_F(LoadErrors, ConfigNamesMoreExpertsThanStored) {
  edit_config([](nlohmann::json& j) { j["num_experts"] = 16; });
  // The router is the first tensor that disagrees: [8, 64] stored, [16, 64] implied.
  expect_error(StatusCode::invalid_argument, {"model.layers.0.mlp.gate.weight", "num_experts=16"});
}

TEST_F(LoadErrors, UnsupportedTensorDtype) {
  const std::string t = "model.layers.0.self_attn.v_proj.weight";
  test::edit_safetensors_header(st(), [&](nlohmann::ordered_json& h) { h[t]["dtype"] = "I32"; });
  expect_error(StatusCode::not_supported, {"'" + t + "'", "I32"});
}

TEST_F(LoadErrors, TruncatedSafetensors) {
  std::filesystem::resize_file(st(), std::filesystem::file_size(st()) / 2);
  expect_error(StatusCode::corrupt_data, {st(), "truncated"});
}

TEST_F(LoadErrors, MissingSafetensors) {
  std::filesystem::remove(st());
  expect_error(StatusCode::not_found, {dir.path(), "model.safetensors"});
}

TEST_F(LoadErrors, MissingConfig) {
  std::filesystem::remove(dir.file("config.json"));
  expect_error(StatusCode::not_found, {dir.file("config.json")});
}

TEST_F(LoadErrors, UnknownModelType) {
  edit_config([](nlohmann::json& j) { j["model_type"] = "llama4"; });
  expect_error(StatusCode::not_supported, {"config.json", "model_type", "llama4"});
}

TEST_F(LoadErrors, UntiedWithoutLmHead) {
  test::edit_safetensors_header(st(), [&](nlohmann::ordered_json& h) { h.erase("lm_head.weight"); });
  expect_error(StatusCode::not_found, {"'lm_head.weight'"});
}

TEST_F(LoadErrors, FusedWithoutDownProj) {
  write(ExpertLayout::fused);
  test::edit_safetensors_header(st(), [&](nlohmann::ordered_json& h) { h.erase("model.layers.1.mlp.experts.down_proj"); });
  expect_error(StatusCode::not_found, {"'model.layers.1.mlp.experts.down_proj'"});
}

TEST_F(LoadErrors, FusedShapeWrong) {
  write(ExpertLayout::fused);
  const std::string t = "model.layers.0.mlp.experts.gate_up_proj";
  test::edit_safetensors_header(st(), [&](nlohmann::ordered_json& h) { h[t]["shape"] = {16, 32, 64}; });
  expect_error(StatusCode::invalid_argument, {"'" + t + "'", "2*moe_intermediate_size=64"});
}

TEST_F(LoadErrors, ShardIndexNamesMissingShard) {
  MakeModelOptions opt;
  opt.out_dir = dir.path();
  opt.shard_size = 100000;
  ASSERT_TRUE(make_model(config, opt).ok());
  auto index = nlohmann::json::parse(test::read_bytes(dir.file("model.safetensors.index.json")));
  const std::string shard = index["weight_map"]["model.layers.1.input_layernorm.weight"];
  ASSERT_NE(shard, index["weight_map"]["model.embed_tokens.weight"]);  // really sharded
  std::filesystem::remove(dir.file(shard));
  expect_error(StatusCode::not_found, {shard, "index.json", "does not exist"});
}

TEST(LoadModel, TiedEmbeddingsShareStorage) {
  test::TempDir dir;
  auto c = make_preset_config(Arch::qwen3_moe, "tiny");
  ASSERT_TRUE(c.ok());
  c->tie_word_embeddings = true;
  MakeModelOptions opt;
  opt.out_dir = dir.path();
  ASSERT_TRUE(make_model(*c, opt).ok());
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.ok());
  EXPECT_FALSE((*ck)->contains("lm_head.weight"));
  auto w = load_model(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_TRUE((*w)->config.tie_word_embeddings);
  EXPECT_EQ((*w)->lm_head.data, (*w)->embed.data);
  EXPECT_EQ((*w)->lm_head.rows, c->vocab_size);
}

TEST(LoadModel, DenseLayersAndMatrixBytes) {
  test::TempDir dir;
  auto c = make_preset_config(Arch::qwen3_moe, "tiny");
  ASSERT_TRUE(c.ok());
  c->n_layers = 4;
  c->decoder_sparse_step = 2;  // layers 1, 3 MoE
  c->mlp_only_layers = {3};    // ... but 3 dense
  MakeModelOptions opt;
  opt.out_dir = dir.path();
  ASSERT_TRUE(make_model(*c, opt).ok());
  auto w = load_model(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const auto& L = (*w)->layers;
  EXPECT_FALSE(L[0].is_moe);
  EXPECT_TRUE(L[1].is_moe);
  EXPECT_FALSE(L[2].is_moe);
  EXPECT_FALSE(L[3].is_moe);
  expect_shape(L[0].dense.gate, c->intermediate_size, c->hidden_size, DType::bf16, "dense gate");
  expect_shape(L[3].dense.down, c->hidden_size, c->intermediate_size, DType::bf16, "dense down");
  expect_matrix_values(L[3].dense.up, *c, "model.layers.3.mlp.up_proj.weight", DType::bf16);
  EXPECT_TRUE(L[0].moe.experts.empty());
  EXPECT_FALSE((*w)->checkpoint->contains("model.layers.0.mlp.gate.weight"));

  // Every bf16 matrix is bound in place; norms (1-D) are the only tensors not counted.
  uint64_t vector_bytes = 0;
  for (const auto& name : (*w)->checkpoint->tensor_names()) {
    const TensorRef* r = (*w)->checkpoint->find(name);
    if (r->info->shape.size() == 1) vector_bytes += r->info->nbytes();
  }
  EXPECT_EQ((*w)->matrix_bytes(), (*w)->checkpoint->total_bytes() - vector_bytes);
}

TEST(LoadModel, FusedAndPerExpertHoldTheSameModel) {
  test::TempDir a, b;
  auto c = make_preset_config(Arch::qwen3_moe, "tiny");
  ASSERT_TRUE(c.ok());
  MakeModelOptions opt;
  opt.out_dir = a.path();
  ASSERT_TRUE(make_model(*c, opt).ok());
  opt.out_dir = b.path();
  opt.layout = ExpertLayout::fused;
  ASSERT_TRUE(make_model(*c, opt).ok());
  auto wa = load_model(a.path());
  auto wb = load_model(b.path());
  ASSERT_TRUE(wa.ok() && wb.ok());
  for (size_t l = 0; l < (*wa)->layers.size(); ++l) {
    for (size_t e = 0; e < (*wa)->layers[l].moe.experts.size(); ++e) {
      const FfnWeights& x = (*wa)->layers[l].moe.experts[e];
      const FfnWeights& y = (*wb)->layers[l].moe.experts[e];
      for (auto [p, q] : {std::pair{&x.gate, &y.gate}, {&x.up, &y.up}, {&x.down, &y.down}}) {
        ASSERT_EQ(p->nbytes(), q->nbytes());
        ASSERT_EQ(std::memcmp(p->data, q->data, p->nbytes()), 0) << "layer " << l << " expert " << e;
      }
    }
  }
}

// transformers v5 saves Mixtral's fused experts and router under "mlp." (MixtralExperts).
TEST(LoadModel, MixtralFusedUnderMlpPrefix) {
  test::TempDir dir;
  auto c = make_preset_config(Arch::mixtral, "tiny");
  ASSERT_TRUE(c.ok());
  MakeModelOptions opt;
  opt.out_dir = dir.path();
  opt.layout = ExpertLayout::fused;
  ASSERT_TRUE(make_model(*c, opt).ok());
  test::edit_safetensors_header(dir.file("model.safetensors"), [](nlohmann::ordered_json& h) {
    nlohmann::ordered_json out;
    for (auto it = h.begin(); it != h.end(); ++it) {
      std::string k = it.key();
      auto p = k.find("block_sparse_moe.");
      if (p != std::string::npos) k.replace(p, 17, "mlp.");
      out[k] = it.value();
    }
    h = out;
  });
  auto w = load_model(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_matrix_values((*w)->layers[0].moe.router, *c, "model.layers.0.block_sparse_moe.gate.weight", DType::bf16);
  expect_matrix_values((*w)->layers[1].moe.experts[6].up, *c, "model.layers.1.block_sparse_moe.experts.6.w3.weight",
                       DType::bf16);
}

TEST(MakeModel, PresetSizes) {
  // bf16 bytes of the presets: computed from the shapes, not written.
  for (Arch a : {Arch::qwen3_moe, Arch::qwen2_moe, Arch::mixtral}) {
    auto c = make_preset_config(a, "bench");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    int64_t params = 2 * c->vocab_size * c->hidden_size;
    params += c->n_layers * (2 * c->q_dim() * c->hidden_size + 2 * c->kv_dim() * c->hidden_size +
                             c->n_experts * c->hidden_size + c->n_experts * 3 * c->moe_intermediate_size * c->hidden_size);
    EXPECT_GE(params * 2, 1'500'000'000) << arch_name(a);
  }
  EXPECT_FALSE(make_preset_config(Arch::qwen3_moe, "huge").ok());
}

TEST(MakeModel, DeterministicAndSeedDependent) {
  auto c = make_preset_config(Arch::qwen3_moe, "tiny");
  ASSERT_TRUE(c.ok());
  const std::string n = "model.layers.0.self_attn.q_proj.weight";
  auto a = make_model_tensor_values(*c, 1, n);
  auto b = make_model_tensor_values(*c, 1, n);
  auto d = make_model_tensor_values(*c, 2, n);
  ASSERT_EQ(a.size(), static_cast<size_t>(c->q_dim() * c->hidden_size));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
  // std ~ 1/sqrt(fan_in) for matrices.
  double ss = 0;
  for (float v : a) ss += double(v) * v;
  EXPECT_NEAR(std::sqrt(ss / a.size()), 1.0 / std::sqrt(double(c->hidden_size)), 0.01);
  EXPECT_TRUE(make_model_tensor_values(*c, 1, "no.such.tensor").empty());
}

TEST(MakeModel, UnwritableDirectoryIsAnError) {
  auto c = make_preset_config(Arch::qwen3_moe, "tiny");
  ASSERT_TRUE(c.ok());
  MakeModelOptions opt;
  opt.out_dir = "/proc/afd-cannot-write-here";
  auto r = make_model(*c, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/proc/afd-cannot-write-here"), std::string::npos);
}

}  // namespace
}  // namespace afd::test_load_model

namespace afd::test_load_model {
namespace {

// Runs only from the make_model_cli_load ctest entry, on the directory `afd make-model`
// wrote (qwen2_moe tiny, fused, f16, sharded, seed 1); skipped elsewhere.
TEST(CliModel, LoadsWhatTheCommandWrote) {
  const char* dir = std::getenv("AFD_TEST_MODEL_DIR");
  if (!dir) GTEST_SKIP() << "AFD_TEST_MODEL_DIR not set";
  auto w = load_model(dir);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_TRUE((*w)->checkpoint->sharded());
  EXPECT_GT((*w)->checkpoint->files().size(), 1u);
  EXPECT_FALSE((*w)->checkpoint->contains("model.layers.0.mlp.experts.0.gate_proj.weight"));
  EXPECT_TRUE((*w)->checkpoint->contains("model.layers.0.mlp.experts.gate_up_proj"));
  const ModelConfig& c = (*w)->config;
  EXPECT_EQ(c.arch, Arch::qwen2_moe);
  expect_matrix_values((*w)->layers[1].moe.experts[5].up, c, "model.layers.1.mlp.experts.5.up_proj.weight", DType::f16);
  expect_matrix_values((*w)->layers[0].moe.shared.down, c, "model.layers.0.mlp.shared_expert.down_proj.weight",
                       DType::f16);
}

}  // namespace
}  // namespace afd::test_load_model
