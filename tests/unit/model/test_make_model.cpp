// make_model from given weights (MakeModelOptions::weights_path), DeepSeek's MTP modules, and
// config.json round trips: a checkpoint rebuilt from its own tensors is the same checkpoint
// (bf16-rounded from f32, FP8 bit for bit), a weights file that does not match the model name
// for name and shape for shape is refused naming the tensor, MTP modules have the layout of
// the golden DeepSeek-V3 checkpoint and the engine still loads and generates, and every
// written config.json parses back to the configuration it was written for.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include "model/checkpoint.h"
#include "model/tools/make_model.h"
#include "model/quantize.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"
#include "model_test_util.h"
#include "runtime/engine_factory.h"
#include "runtime/generate.h"

namespace afd {
namespace {

namespace fs = std::filesystem;

ModelConfig preset(Arch a, int64_t mtp = 0) {
  auto c = make_preset_config(a, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  c->num_nextn_predict_layers = mtp;
  return *c;
}

void make(const ModelConfig& c, const std::string& dir, DType dt, uint64_t seed, const std::string& weights = "",
          ExpertLayout layout = ExpertLayout::per_expert) {
  MakeModelOptions o;
  o.out_dir = dir;
  o.dtype = dt;
  o.seed = seed;
  o.weights_path = weights;
  o.layout = layout;
  auto r = make_model(c, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

// f32 values of a floating tensor.
std::vector<float> values_f32(const TensorRef& t) {
  std::vector<float> v(static_cast<size_t>(t.info->numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.info->dtype == DType::f32) {
      std::memcpy(&v[i], t.data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = t.info->dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return v;
}

// A weights file (dir/model.safetensors, tensors as `dtype`; F32 ones stay F32) holding the
// logical tensors of the checkpoint in `model_dir`: its tensors, with Step-3's stacked
// moe.{gate,up,down}_proj.weight [E, ., .] and the fused experts.gate_up_proj [E, 2I, H] /
// experts.down_proj split into per-expert tensors. `edit` may change a tensor's name/shape or
// drop it; `extra` tensors (filler values) are appended.
std::string weights_file_of(const std::string& model_dir, const std::string& dir, DType dtype,
                            const std::function<bool(TensorSpec&)>& edit = nullptr,
                            const std::vector<TensorSpec>& extra = {}) {
  auto ck = Checkpoint::open(model_dir);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  std::vector<TensorSpec> specs;
  std::vector<std::vector<float>> vals;
  static const std::regex stacked(R"((model\.layers\.\d+\.moe\.)(gate|up|down)_proj\.weight)");
  static const std::regex fused(R"((model\.layers\.\d+\.mlp\.experts\.)(gate_up|down)_proj)");
  for (const std::string& n : (*ck)->tensor_names()) {
    const TensorRef* t = (*ck)->find(n);
    const DType dt = t->info->dtype == DType::f32 ? DType::f32 : dtype;
    std::vector<float> v = values_f32(*t);
    const auto& s = t->info->shape;
    // Per expert e: (name suffix, rows) of its consecutive slices of the [E, R, C] tensor.
    std::vector<std::pair<std::string, int64_t>> parts;
    std::smatch m;
    if (std::regex_match(n, m, stacked)) {
      parts = {{m[2].str() + "_proj.weight", s[1]}};
    } else if (std::regex_match(n, m, fused) && m[2] == "gate_up") {
      parts = {{"gate_proj.weight", s[1] / 2}, {"up_proj.weight", s[1] / 2}};
    } else if (std::regex_match(n, m, fused)) {
      parts = {{"down_proj.weight", s[1]}};
    } else {
      specs.push_back({n, dt, s});
      vals.push_back(std::move(v));
      continue;
    }
    auto at = v.begin();
    for (int64_t e = 0; e < s[0]; ++e) {
      for (const auto& [suffix, rows] : parts) {
        const std::string prefix = std::regex_match(n, stacked) ? m[1].str() + "experts." : m[1].str();
        specs.push_back({prefix + std::to_string(e) + "." + suffix, dt, {rows, s[2]}});
        vals.emplace_back(at, at + static_cast<std::ptrdiff_t>(rows * s[2]));
        at += static_cast<std::ptrdiff_t>(rows * s[2]);
      }
    }
  }
  for (const TensorSpec& t : extra) {
    specs.push_back(t);
    vals.emplace_back();
  }
  std::vector<TensorSpec> kept;
  std::vector<std::vector<float>> kept_vals;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (edit && !edit(specs[i])) continue;
    int64_t n = 1;
    for (int64_t d : specs[i].shape) n *= d;
    vals[i].resize(static_cast<size_t>(n), 0.5f);  // a changed shape gets filler values
    kept.push_back(specs[i]);
    kept_vals.push_back(std::move(vals[i]));
  }
  fs::create_directories(dir);
  auto r = write_checkpoint_tensors(dir, kept, uint64_t{1} << 40, [&](size_t i, const ByteWriter& w) {
    const std::vector<float>& v = kept_vals[i];
    if (kept[i].dtype == DType::f32) return w(v.data(), v.size() * 4);
    std::vector<uint16_t> h(v.size());
    for (size_t k = 0; k < v.size(); ++k) h[k] = f32_to_bf16(v[k]).bits;
    return w(h.data(), h.size() * 2);
  });
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return dir + "/" + kSafetensorsSingleName;
}

// Every tensor of checkpoint `got` equals `want`'s: bytes equal when `exact`, else `got`'s bf16
// tensors hold `want`'s f32 values rounded to bf16 (f32 tensors stay equal).
void expect_same_tensors(const std::string& want_dir, const std::string& got_dir, bool exact) {
  auto want = Checkpoint::open(want_dir);
  auto got = Checkpoint::open(got_dir);
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ((*want)->tensor_names(), (*got)->tensor_names());
  for (const std::string& n : (*want)->tensor_names()) {
    const TensorRef* a = (*want)->find(n);
    const TensorRef* b = (*got)->find(n);
    ASSERT_EQ(a->info->shape, b->info->shape) << n;
    if (exact) {
      ASSERT_EQ(a->info->dtype, b->info->dtype) << n;
      ASSERT_EQ(0, std::memcmp(a->data, b->data, a->info->nbytes())) << n;
      continue;
    }
    std::vector<float> va = values_f32(*a), vb = values_f32(*b);
    for (size_t i = 0; i < va.size(); ++i) {
      const float w = b->info->dtype == DType::f32 ? va[i] : round_bf16(va[i]);
      ASSERT_EQ(vb[i], w) << n << " [" << i << "]";
    }
  }
}

struct Case {
  Arch arch;
  int64_t mtp;
  ExpertLayout layout;
};

class FromWeights : public ::testing::TestWithParam<Case> {};

// Seed 1's f32 checkpoint, read back into a weights file, rebuilt with seed 999: the values are
// the file's (seed 1's, bf16-rounded), and the FP8 rebuild is seed 1's FP8 checkpoint byte for byte.
TEST_P(FromWeights, RebuiltCheckpointHoldsTheFileValues) {
  const Case k = GetParam();
  const ModelConfig c = preset(k.arch, k.mtp);
  test::TempDir d;
  make(c, d.file("f32"), DType::f32, 1, "", k.layout);
  const std::string w = weights_file_of(d.file("f32"), d.file("w"), DType::f32);
  make(c, d.file("bf16"), DType::bf16, 999, w, k.layout);
  expect_same_tensors(d.file("f32"), d.file("bf16"), false);
  make(c, d.file("fp8_seed"), DType::f8_e4m3, 1, "", k.layout);
  make(c, d.file("fp8_file"), DType::f8_e4m3, 999, w, k.layout);
  expect_same_tensors(d.file("fp8_seed"), d.file("fp8_file"), true);
  // A BF16 weights file of a bf16 checkpoint rebuilds it byte for byte.
  const std::string wb = weights_file_of(d.file("bf16"), d.file("wb"), DType::bf16);
  make(c, d.file("bf16_again"), DType::bf16, 7, wb, k.layout);
  expect_same_tensors(d.file("bf16"), d.file("bf16_again"), true);
}

INSTANTIATE_TEST_SUITE_P(Tiny, FromWeights,
                         ::testing::Values(Case{Arch::qwen3_moe, 0, ExpertLayout::per_expert},
                                           Case{Arch::qwen2_moe, 0, ExpertLayout::fused},
                                           Case{Arch::deepseek_v3, 1, ExpertLayout::per_expert},
                                           Case{Arch::step3_text, 0, ExpertLayout::per_expert}),
                         [](const auto& i) {
                           return std::string(arch_name(i.param.arch)) + (i.param.mtp ? "_mtp" : "");
                         });

// make_model's error for the weights file written by `edit` from the step3 tiny checkpoint.
std::string weights_error(const std::function<bool(TensorSpec&)>& edit) {
  const ModelConfig c = preset(Arch::step3_text);
  test::TempDir d("afd_model_weights_error");
  make(c, d.file("m"), DType::bf16, 1);
  const std::string w = weights_file_of(d.file("m"), d.file("w"), DType::bf16, edit);
  MakeModelOptions o;
  o.out_dir = d.file("out");
  o.weights_path = w;
  auto r = make_model(c, o);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(fs::exists(d.file("out") + "/model.safetensors")) << "nothing is written on error";
  return r.ok() ? "" : r.status().to_string();
}

TEST(FromWeightsErrors, MissingTensorIsNamedWithItsShape) {
  const std::string e = weights_error(
      [](TensorSpec& s) { return s.name != "model.layers.1.moe.experts.5.up_proj.weight"; });
  EXPECT_NE(e.find("no tensor 'model.layers.1.moe.experts.5.up_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[160, 256]"), std::string::npos) << e;
}

TEST(FromWeightsErrors, ExtraTensorIsNamed) {
  const std::string e = weights_error([](TensorSpec& s) {
    if (s.name == "model.norm.weight") s.name = "model.final_norm.weight";
    return true;
  });
  // A renamed tensor is missing first; with every tensor present, the extra one is named.
  EXPECT_NE(e.find("no tensor 'model.norm.weight'"), std::string::npos) << e;
  const ModelConfig c = preset(Arch::step3_text);
  test::TempDir d;
  make(c, d.file("m"), DType::bf16, 1);
  const std::string w = weights_file_of(d.file("m"), d.file("w"), DType::bf16, nullptr,
                                        {{"model.layers.9.extra.weight", DType::bf16, {256}}});
  MakeModelOptions o;
  o.out_dir = d.file("out");
  o.weights_path = w;
  auto r = make_model(c, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'model.layers.9.extra.weight' [256] is not a tensor of this model"),
            std::string::npos)
      << r.status().to_string();
}

TEST(FromWeightsErrors, WrongShapeNamesBothShapes) {
  const std::string e = weights_error([](TensorSpec& s) {
    if (s.name == "model.layers.0.self_attn.wq.weight") s.shape = {192, 256};
    return true;
  });
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.wq.weight' has shape [192, 256], the model needs [256, 192]"),
            std::string::npos)
      << e;
}

TEST(FromWeightsErrors, StackedExpertTensorIsNotALogicalName) {
  // Step-3's file layout ([E, I, H]) is not what the weights file holds.
  const ModelConfig c = preset(Arch::step3_text);
  test::TempDir d;
  make(c, d.file("m"), DType::bf16, 1);
  MakeModelOptions o;
  o.out_dir = d.file("out");
  o.weights_path = d.file("m") + "/model.safetensors";
  auto r = make_model(c, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no tensor 'model.layers.1.moe.experts.0.gate_proj.weight'"), std::string::npos)
      << r.status().to_string();
}

TEST(FromWeightsErrors, NonFiniteValueAndMissingFile) {
  const ModelConfig c = preset(Arch::qwen3_moe);
  test::TempDir d;
  make(c, d.file("m"), DType::f32, 1);
  const std::string w = weights_file_of(d.file("m"), d.file("w"), DType::f32);
  // Overwrite the first value of model.norm.weight with NaN.
  nlohmann::ordered_json h;
  std::string data;
  test::split_safetensors(test::read_bytes(w), &h, &data);
  const uint64_t at = h["model.norm.weight"]["data_offsets"][0].get<uint64_t>();
  const float nan = std::nanf("");
  std::memcpy(&data[at], &nan, 4);
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  test::write_bytes(w, test::safetensors_bytes(text, data));
  MakeModelOptions o;
  o.out_dir = d.file("out");
  o.weights_path = w;
  auto r = make_model(c, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'model.norm.weight' holds a non-finite value at element 0"), std::string::npos)
      << r.status().to_string();
  o.weights_path = d.file("absent.safetensors");
  r = make_model(c, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("absent.safetensors"), std::string::npos) << r.status().to_string();
}

// ---- MTP modules ----

TEST(MakeModelMtp, LayoutEqualsTheGoldenDeepseekV3Checkpoint) {
  const std::string golden = std::string(AFD_SOURCE_DIR) + "/tests/reference/data/dsv3_tiny_fp8";
  auto c = load_model_config(golden);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->num_nextn_predict_layers, 1);
  test::TempDir d;
  make(*c, d.path(), DType::f8_e4m3, 1);
  auto want = Checkpoint::open(golden);
  auto got = Checkpoint::open(d.path());
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ((*want)->tensor_names(), (*got)->tensor_names());
  for (const std::string& n : (*want)->tensor_names()) {
    EXPECT_EQ((*want)->find(n)->info->dtype, (*got)->find(n)->info->dtype) << n;
    EXPECT_EQ((*want)->find(n)->info->shape, (*got)->find(n)->info->shape) << n;
  }
}

TEST(MakeModelMtp, ModuleTensorsHaveTheirShapesAndTheEngineStillGenerates) {
  ModelConfig c = preset(Arch::deepseek_v3, 1);
  test::TempDir d;
  make(c, d.path(), DType::bf16, 1);
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok());
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const std::string p = "model.layers." + std::to_string(c.n_layers) + ".";
  const std::map<std::string, std::vector<int64_t>> want = {
      {"enorm.weight", {H}},
      {"hnorm.weight", {H}},
      {"eh_proj.weight", {H, 2 * H}},
      {"shared_head.norm.weight", {H}},
      {"shared_head.head.weight", {V, H}},
      {"embed_tokens.weight", {V, H}},
      {"input_layernorm.weight", {H}},
      {"self_attn.kv_b_proj.weight", {c.n_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}},
      {"mlp.gate.weight", {c.n_experts, H}},
      {"mlp.experts.15.down_proj.weight", {H, c.moe_intermediate_size}},
      {"mlp.shared_experts.up_proj.weight", {c.shared_expert_intermediate_size, H}},
  };
  for (const auto& [name, shape] : want) {
    const TensorRef* t = (*ck)->find(p + name);
    ASSERT_NE(t, nullptr) << p + name;
    EXPECT_EQ(t->info->shape, shape) << p + name;
    EXPECT_EQ(t->info->dtype, DType::bf16) << p + name;
  }
  EXPECT_EQ((*ck)->find("model.layers." + std::to_string(c.n_layers + 1) + ".enorm.weight"), nullptr);

  // The main model loads (the MTP layer is not bound) and generates the tokens of the same
  // checkpoint without the module.
  test::TempDir plain("afd_model_mtp_plain");
  ModelConfig c0 = c;
  c0.num_nextn_predict_layers = 0;
  make(c0, plain.path(), DType::bf16, 1);
  auto run = [](const std::string& dir) {
    auto w = load_model(dir);
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    EngineOptions o;
    o.precision = Precision::reference;
    o.kv.max_seqs = 2;
    o.kv.capacity_tokens = 512;
    auto e = make_engine(o, *w);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    GenerateOptions g;
    g.max_new_tokens = 6;
    g.stop_at_eos = false;
    auto r = generate(**e, {{5, 17, 300, 2}}, g);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r->tokens[0] : std::vector<int32_t>{};
  };
  const std::vector<int32_t> with = run(d.path());
  EXPECT_EQ(with.size(), 6u);
  EXPECT_EQ(with, run(plain.path()));
}

TEST(MakeModelMtp, QuantizedToFp8ItHasTheLayoutMakeModelWritesInFp8) {
  const ModelConfig c = preset(Arch::deepseek_v3, 1);
  test::TempDir d;
  make(c, d.file("bf16"), DType::bf16, 1);
  make(c, d.file("fp8"), DType::f8_e4m3, 1);
  auto r = convert_checkpoint(d.file("bf16"), d.file("q"), ConvertOptions{});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto want = Checkpoint::open(d.file("fp8"));
  auto got = Checkpoint::open(d.file("q"));
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ((*want)->tensor_names(), (*got)->tensor_names());
  for (const std::string& n : (*want)->tensor_names()) {
    EXPECT_EQ((*want)->find(n)->info->dtype, (*got)->find(n)->info->dtype) << n;
    EXPECT_EQ((*want)->find(n)->info->shape, (*got)->find(n)->info->shape) << n;
  }
  EXPECT_TRUE(load_model(d.file("q")).ok());
}

TEST(MakeModelMtp, OnlyDeepseekHasMtpModules) {
  test::TempDir d;
  MakeModelOptions o;
  o.out_dir = d.path();
  auto r = make_model(preset(Arch::qwen3_moe, 1), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_nextn_predict_layers"), std::string::npos) << r.status().to_string();
}

// ---- config.json round trips ----

// What parsing the config.json written for `c` in `dtype` must give back.
ModelConfig as_written(ModelConfig c, DType dtype) {
  c.torch_dtype = dtype == DType::f32 ? "float32" : dtype == DType::f16 ? "float16" : "bfloat16";
  if (dtype == DType::f8_e4m3) c.weight_quant = WeightQuant::fp8_block;
  c.quant_scale_fmt.clear();
  return c;
}

void expect_round_trip(const ModelConfig& c, DType dtype, const std::string& what) {
  auto back = parse_model_config(model_config_to_json(c, dtype));
  ASSERT_TRUE(back.ok()) << what << ": " << back.status().to_string();
  const char* diff = model_config_difference(*back, as_written(c, dtype));
  EXPECT_EQ(diff, nullptr) << what << ": '" << diff << "' differs";
}

TEST(MakeModelConfig, EveryPresetRoundTrips) {
  for (const char* type :
       {"qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v2", "deepseek_v3", "kimi_k2", "step3_text"}) {
    for (const char* p : {"tiny", "small", "bench"}) {
      auto c = make_preset_config(type, p);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      for (DType dt : {DType::bf16, DType::f32, DType::f8_e4m3}) {
        expect_round_trip(*c, dt, std::string(type) + " " + p);
        if (c->arch == Arch::deepseek_v3 || c->arch == Arch::deepseek_v2) {
          ModelConfig m = *c;
          m.num_nextn_predict_layers = 2;
          expect_round_trip(m, dt, std::string(type) + " " + p + " mtp");
        }
      }
    }
  }
}

TEST(MakeModelConfig, EveryGoldenConfigRoundTrips) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(AFD_SOURCE_DIR) + "/tests/reference/data")) {
    if (!fs::exists(e.path() / "config.json")) continue;
    auto c = load_model_config(e.path().string());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    expect_round_trip(*c, DType::bf16, e.path().filename().string());
    ++n;
  }
  EXPECT_GE(n, 14);
}

TEST(MakeModelConfig, AWrittenCheckpointLoadsWithItsConfiguration) {
  ModelConfig c = preset(Arch::step3_text);
  c.rope_theta = 12345.0;
  test::TempDir d;
  make(c, d.path(), DType::f8_e4m3, 1);
  auto back = load_model_config(d.path());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  const char* diff = model_config_difference(*back, as_written(c, DType::f8_e4m3));
  EXPECT_EQ(diff, nullptr) << diff;
}

TEST(MakeModelConfig, ASettingTheWriterCannotExpressIsRefused) {
  ModelConfig c = preset(Arch::deepseek_v3);
  c.mlp_only_layers = {2};  // not a DeepSeek config.json field
  test::TempDir d;
  MakeModelOptions o;
  o.out_dir = d.path();
  auto r = make_model(c, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'mlp_only_layers' differs"), std::string::npos) << r.status().to_string();
}

}  // namespace
}  // namespace afd
