// FP8 block-quantized checkpoints end to end on the model side: config parsing, make_model
// --dtype fp8 and afd quantize's conversion (model/quantize.h) load with their block scales
// in place (partial edge blocks, block-row offsets of the fused layout), the quantized model's
// logits equal those of a checkpoint holding its dequantized weights (reference precision),
// tensor-parallel slices of FP8 FFNs add up to the whole, and bad inputs fail naming the field
// or tensor. Also measures the FP8 deviation from the bf16 original (docs/ACCURACY.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "checkpoint_rewrite.h"
#include "kernels/cpu/linear_fp8.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/ffn_part.h"
#include "model/tools/make_model.h"
#include "model/quantize.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"
#include "model_test_util.h"
#include "runtime/engine_factory.h"
#include "runtime/generate.h"

namespace afd {
namespace {

using test::rewrite_checkpoint;
using test::TempDir;

// qwen3_moe with every projection spanning more than one block and ending in a partial one:
// hidden 192, q [192, 192] -> scales [2, 2], k/v [96, 192] -> [1, 2], experts [136, 192] /
// [192, 136] -> [2, 2]; 2 dense-free layers, 6 experts top-2.
ModelConfig multi_block_config(Arch arch = Arch::qwen3_moe) {
  ModelConfig c = *make_preset_config(arch, "tiny");
  c.vocab_size = 300;
  c.hidden_size = 192;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 48;
  c.n_experts = 6;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 136;
  if (arch == Arch::mixtral) c.intermediate_size = c.moe_intermediate_size;
  if (arch == Arch::qwen2_moe) c.shared_expert_intermediate_size = 160;
  EXPECT_TRUE(c.validate().is_ok());
  return c;
}

std::string make(const ModelConfig& c, const std::string& dir, DType dt, ExpertLayout layout = ExpertLayout::per_expert) {
  MakeModelOptions o;
  o.out_dir = dir;
  o.seed = 1;
  o.dtype = dt;
  o.layout = layout;
  auto r = make_model(c, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return dir;
}

std::vector<float> dequantized(const Matrix& m) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) matrix_row_f32(m, r, out.data() + r * m.cols);
  return out;
}

// What make_model --dtype fp8 must hold for a [rows, cols] piece at row `row0` of its stored
// (slab) tensor of `slab_rows` rows: the make_model values of the whole slab, quantized per block.
std::vector<float> expected_fp8(const std::vector<float>& slab, int64_t slab_rows, int64_t cols, int64_t row0,
                                int64_t rows) {
  std::vector<uint8_t> q(slab.size());
  const int64_t sb = (cols + 127) / 128;
  std::vector<float> s(static_cast<size_t>((slab_rows + 127) / 128 * sb));
  kernels::quantize_fp8_blocks(slab.data(), slab_rows, cols, q.data(), s.data());
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k)
      out[static_cast<size_t>(r * cols + k)] =
          fp8_e4m3_to_f32(q[static_cast<size_t>((row0 + r) * cols + k)]) * s[static_cast<size_t>((row0 + r) / 128 * sb + k / 128)];
  return out;
}

TEST(Fp8Config, ParsesQuantizationConfig) {
  ModelConfig c = multi_block_config();
  std::string text = model_config_to_json(c, DType::f8_e4m3);
  auto p = parse_model_config(text);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->weight_quant, WeightQuant::fp8_block);
  auto b = parse_model_config(model_config_to_json(c, DType::bf16));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->weight_quant, WeightQuant::none);
  nlohmann::json j = nlohmann::json::parse(text);
  j["quantization_config"]["scale_fmt"] = "ue8m0";  // DeepSeek-V3.1
  EXPECT_TRUE(parse_model_config(j.dump()).ok());
}

TEST(Fp8Config, RejectsUnsupportedQuantizationNamingTheField) {
  const std::string base = model_config_to_json(multi_block_config(), DType::f8_e4m3);
  struct Bad {
    const char* key;
    nlohmann::json value;  // null: erase the key
    const char* want;
  };
  for (const Bad& b : {Bad{"quant_method", "awq", "quantization_config.quant_method"},
                       Bad{"fmt", "e5m2", "quantization_config.fmt"},
                       Bad{"activation_scheme", "static", "quantization_config.activation_scheme"},
                       Bad{"weight_block_size", nlohmann::json::array({64, 64}), "quantization_config.weight_block_size"},
                       Bad{"weight_block_size", nullptr, "quantization_config.weight_block_size"},
                       Bad{"weight_block_size", "128", "quantization_config.weight_block_size"},
                       Bad{"scale_fmt", "e8m0x", "quantization_config.scale_fmt"}}) {
    nlohmann::json j = nlohmann::json::parse(base);
    if (b.value.is_null()) j["quantization_config"].erase(b.key);
    else j["quantization_config"][b.key] = b.value;
    auto r = parse_model_config(j.dump());
    ASSERT_FALSE(r.ok()) << b.key;
    EXPECT_NE(r.status().message().find(b.want), std::string::npos) << r.status().to_string();
  }
  nlohmann::json j = nlohmann::json::parse(base);
  j["quantization_config"] = "fp8";
  auto r = parse_model_config(j.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("quantization_config"), std::string::npos);
}

// make_model --dtype fp8 loads in place: projections FP8 with [ceil(r/128), ceil(c/128)]
// scales, the rest bf16; every weight equals make_model's value quantized per block. The fused
// layout's up half starts 136 rows into its slab (8 rows into block row 1): a row offset.
TEST(Fp8Model, MakeModelFp8LoadsWithBlockScalesInPlace) {
  for (ExpertLayout layout : {ExpertLayout::per_expert, ExpertLayout::fused}) {
    TempDir d;
    const ModelConfig c = multi_block_config();
    make(c, d.path(), DType::f8_e4m3, layout);
    auto w = load_model(d.path());
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const ModelWeights& m = **w;
    EXPECT_EQ(m.config.weight_quant, WeightQuant::fp8_block);
    EXPECT_EQ(m.embed.dtype, DType::bf16);
    EXPECT_EQ(m.lm_head.dtype, DType::bf16);
    const LayerWeights& L = m.layers[1];
    EXPECT_EQ(L.moe.router.dtype, DType::bf16);
    for (const Matrix* x : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o}) {
      EXPECT_TRUE(x->is_fp8());
      EXPECT_EQ(x->scale_stride, (x->cols + 127) / 128);
    }
    // In place: the bytes are the mapped file's.
    const TensorRef* tq = m.checkpoint->find("model.layers.1.self_attn.q_proj.weight");
    ASSERT_NE(tq, nullptr);
    EXPECT_EQ(static_cast<const void*>(tq->data), L.attn.q.data);
    const std::string a = "model.layers.1.self_attn.";
    EXPECT_EQ(dequantized(L.attn.q), expected_fp8(make_model_tensor_values(c, 1, a + "q_proj.weight"), 192, 192, 0, 192));
    EXPECT_EQ(dequantized(L.attn.k), expected_fp8(make_model_tensor_values(c, 1, a + "k_proj.weight"), 96, 192, 0, 96));
    const int64_t I = c.moe_intermediate_size, H = c.hidden_size;
    for (int64_t e : {int64_t{0}, int64_t{5}}) {
      const std::string ep = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
      std::vector<float> g = make_model_tensor_values(c, 1, ep + "gate_proj.weight");
      std::vector<float> u = make_model_tensor_values(c, 1, ep + "up_proj.weight");
      const FfnWeights& f = L.moe.experts[static_cast<size_t>(e)];
      if (layout == ExpertLayout::fused) {
        std::vector<float> slab = g;
        slab.insert(slab.end(), u.begin(), u.end());
        EXPECT_EQ(f.up.row_offset, I % 128);
        EXPECT_EQ(dequantized(f.gate), expected_fp8(slab, 2 * I, H, 0, I)) << "expert " << e;
        EXPECT_EQ(dequantized(f.up), expected_fp8(slab, 2 * I, H, I, I)) << "expert " << e;
      } else {
        EXPECT_EQ(dequantized(f.gate), expected_fp8(g, I, H, 0, I)) << "expert " << e;
        EXPECT_EQ(dequantized(f.up), expected_fp8(u, I, H, 0, I)) << "expert " << e;
      }
      EXPECT_EQ(dequantized(f.down),
                expected_fp8(make_model_tensor_values(c, 1, ep + "down_proj.weight"), H, I, 0, H)) << "expert " << e;
    }
    // Bytes per pass: FP8 elements (1 B) plus float32 block scales.
    EXPECT_EQ(L.attn.q.nbytes(), size_t{192 * 192});
    EXPECT_EQ(L.attn.q.scale_bytes(), size_t{4 * 4});
  }
}

// Logits of `dir` for teacher-forced `seq` (every row), with the given precision.
std::vector<float> forward_logits(const std::string& dir, Precision p, const std::vector<int32_t>& seq) {
  auto w = load_model(dir);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  EngineOptions o;
  o.precision = p;
  o.kv.dtype = p == Precision::reference ? DType::f32 : DType::bf16;
  o.kv.max_seqs = 2;
  o.kv.capacity_tokens = 512;
  o.n_threads = 2;
  auto e = make_engine(o, *w);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  auto id = (*e)->create_sequence();
  EXPECT_TRUE(id.ok());
  BatchItem it{*id, seq, true};
  std::vector<float> logits;
  Status s = (*e)->forward(std::span<const BatchItem>(&it, 1), &logits);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return logits;
}

std::vector<int32_t> greedy(const std::string& dir, Precision p, const std::vector<int32_t>& prompt, int64_t n) {
  auto w = load_model(dir);
  EXPECT_TRUE(w.ok());
  EngineOptions o;
  o.precision = p;
  o.kv.max_seqs = 2;
  o.kv.capacity_tokens = 512;
  auto e = make_engine(o, *w);
  EXPECT_TRUE(e.ok());
  GenerateOptions g;
  g.max_new_tokens = n;
  g.stop_at_eos = false;
  auto r = generate(**e, {prompt}, g);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r->tokens[0];
}

struct Deviation {
  double max_abs = 0, median_row = 0, max_logit = 0, argmax_agree = 0;
};

Deviation deviation(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  Deviation d;
  std::vector<double> rows;
  int64_t agree = 0, n = 0;
  for (size_t r = 0; r * vocab < a.size(); ++r) {
    const float* x = &a[r * vocab];
    const float* y = &b[r * vocab];
    double m = 0;
    for (int64_t k = 0; k < vocab; ++k) {
      m = std::max(m, static_cast<double>(std::fabs(x[k] - y[k])));
      d.max_logit = std::max(d.max_logit, static_cast<double>(std::fabs(y[k])));
    }
    rows.push_back(m);
    agree += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
    ++n;
  }
  d.max_abs = *std::max_element(rows.begin(), rows.end());
  std::nth_element(rows.begin(), rows.begin() + static_cast<long>(rows.size() / 2), rows.end());
  d.median_row = rows[rows.size() / 2];
  d.argmax_agree = static_cast<double>(agree) / static_cast<double>(n);
  return d;
}

// The quantized model computes the model of its dequantized weights: `afd quantize --fp8` of a
// bf16 checkpoint, and its `--dequantize --dtype f32` twin, agree to 1e-4 in logits in reference
// precision (teacher-forced prefill and greedy decode). Their deviation from the bf16 original
// (the quantization error itself) is measured and printed for docs/ACCURACY.md.
TEST(Fp8Model, QuantizedLogitsEqualDequantizedCheckpoint) {
  TempDir d;
  const ModelConfig c = multi_block_config();
  const std::string bf = make(c, d.file("bf16"), DType::bf16);
  ConvertOptions q;
  ASSERT_TRUE(convert_checkpoint(bf, d.file("fp8"), q).ok());
  ConvertOptions dq;
  dq.mode = ConvertOptions::Mode::dequantize;
  auto rep = convert_checkpoint(d.file("fp8"), d.file("deq"), dq);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79};
  std::vector<int32_t> seq = prompt;
  const std::vector<int32_t> gen = greedy(d.file("fp8"), Precision::reference, prompt, 12);
  EXPECT_EQ(gen, greedy(d.file("deq"), Precision::reference, prompt, 12));
  seq.insert(seq.end(), gen.begin(), gen.end());
  const auto lf = forward_logits(d.file("fp8"), Precision::reference, seq);
  const auto ld = forward_logits(d.file("deq"), Precision::reference, seq);
  const auto lb = forward_logits(bf, Precision::reference, seq);
  const Deviation same = deviation(lf, ld, c.vocab_size);
  EXPECT_LE(same.max_abs, 1e-4);
  EXPECT_EQ(same.argmax_agree, 1.0);
  const Deviation quant = deviation(lf, lb, c.vocab_size);
  std::printf("fp8 vs dequantized (reference): max |diff| %.3g; fp8 vs bf16 original (reference): max %.4f, "
              "median row %.4f, |logit| max %.3f, argmax agreement %.3f over %zu rows\n",
              same.max_abs, quant.max_abs, quant.median_row, quant.max_logit, quant.argmax_agree,
              lf.size() / static_cast<size_t>(c.vocab_size));
  // FP8 has 3 mantissa bits: a real but bounded change of the model.
  EXPECT_GT(quant.max_abs, 0.0);
  EXPECT_LT(quant.median_row, 0.25 * quant.max_logit);
  // Fast precision on the FP8 weights (the batched path may round dequantized W to bf16).
  const auto lff = forward_logits(d.file("fp8"), Precision::fast, seq);
  const Deviation fast = deviation(lff, ld, c.vocab_size);
  std::printf("fp8 fast vs dequantized reference: max %.4f, median row %.4f, argmax agreement %.3f\n", fast.max_abs,
              fast.median_row, fast.argmax_agree);
  EXPECT_LT(fast.median_row, 0.1 * fast.max_logit + 0.05);
}

// The deviation FP8 block quantization causes on make-model presets (docs/ACCURACY.md, "FP8
// weights"): `afd quantize --fp8` of the bf16 checkpoint against that checkpoint, teacher-forced
// on the bf16 model's own greedy continuation, in reference and in fast precision. The tiny
// preset always runs (with loose bounds); AFD_FP8_ACCURACY_PRESETS=tiny,small measures others.
void measure_preset(const std::string& preset) {
  TempDir d("afd_fp8_accuracy_" + preset);
  const ModelConfig c = *make_preset_config(Arch::qwen3_moe, preset);
  const std::string bf = make(c, d.file("bf16"), DType::bf16);
  ConvertOptions q;
  ASSERT_TRUE(convert_checkpoint(bf, d.file("fp8"), q).ok());
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79};
  std::vector<int32_t> seq = prompt;
  const std::vector<int32_t> gen = greedy(bf, Precision::reference, prompt, 48);
  seq.insert(seq.end(), gen.begin(), gen.end());
  for (Precision p : {Precision::reference, Precision::fast}) {
    const Deviation dv = deviation(forward_logits(d.file("fp8"), p, seq), forward_logits(bf, p, seq), c.vocab_size);
    std::printf("| %s | FP8 vs bf16 weights | %s | %zu | %.4f | %.4f | %.3f | %.3f |\n", preset.c_str(),
                p == Precision::reference ? "reference" : "fast", seq.size(), dv.max_abs, dv.median_row, dv.max_logit,
                dv.argmax_agree);
    EXPECT_GT(dv.max_abs, 0.0);
    EXPECT_LT(dv.median_row, 0.25 * dv.max_logit) << preset;
    EXPECT_GE(dv.argmax_agree, 0.5) << preset;
  }
  // For scale: the same values rounded to bf16 instead of kept in f32 (what a bf16 checkpoint
  // already costs).
  const std::string f32 = make(c, d.file("f32"), DType::f32);
  const Deviation base =
      deviation(forward_logits(bf, Precision::reference, seq), forward_logits(f32, Precision::reference, seq), c.vocab_size);
  std::printf("| %s | bf16 vs f32 weights | reference | %zu | %.4f | %.4f | %.3f | %.3f |\n", preset.c_str(), seq.size(),
              base.max_abs, base.median_row, base.max_logit, base.argmax_agree);
}

TEST(Fp8Accuracy, PresetDeviationFromBf16) {
  const char* env = std::getenv("AFD_FP8_ACCURACY_PRESETS");
  std::string list = env ? env : "tiny";
  std::printf("| preset | compared | precision | rows | max abs diff | median row max diff | max abs logit | argmax agreement |\n");
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    measure_preset(list.substr(at, comma - at));
    at = comma + 1;
  }
}

// FP8 FFN tensor-parallel slices add up to the unsliced output, both for slices on block
// boundaries (I = 256, t = 2) and off them (I = 136, t = 2 and t = 4: block-aligned
// supersets with the other ranks' down columns zeroed).
TEST(Fp8Model, TensorParallelSlicesSumToWhole) {
  for (int64_t inter : {int64_t{136}, int64_t{256}}) {
    for (int t : {2, 4}) {
      if (inter % t) continue;
      TempDir d;
      ModelConfig c = multi_block_config(Arch::qwen2_moe);
      c.moe_intermediate_size = inter;
      c.shared_expert_intermediate_size = 2 * inter;
      make(c, d.path(), DType::f8_e4m3);
      auto w = load_model(d.path());
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      const int64_t n = 5, H = c.hidden_size;
      std::vector<float> h(static_cast<size_t>(n * H));
      for (size_t i = 0; i < h.size(); ++i) h[i] = std::sin(0.37f * static_cast<float>(i));
      std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 1, 3, 5, 0};
      std::vector<float> wts = {0.6f, 0.4f, 0.3f, 0.7f, 0.5f, 0.5f, 0.9f, 0.1f, 0.2f, 0.8f};
      FfnPartOptions o;
      o.prec = kernels::ActPrecision::f32;
      FfnScratch s;
      std::vector<float> whole(h.size()), part(h.size()), sum(h.size(), 0.0f);
      ffn_part(**w, 1, h.data(), n, ids.data(), wts.data(), whole.data(), o, &s, nullptr);
      for (int r = 0; r < t; ++r) {
        auto sl = slice_ffn_tp(*w, FfnTpSlice{r, t, 0, -1, true});
        ASSERT_TRUE(sl.ok()) << sl.status().to_string();
        const FfnWeights& e0 = (*sl)->layers[1].moe.experts[0];
        EXPECT_TRUE(e0.down.is_fp8());
        if ((r * inter / t) % 128 != 0) {
          EXPECT_GT(e0.gate.rows, inter / t) << "block-aligned superset";
          EXPECT_EQ(e0.gate.row_offset, 0);
        } else {
          EXPECT_EQ(e0.gate.rows, inter / t);
        }
        ffn_part(**sl, 1, h.data(), n, ids.data(), wts.data(), part.data(), o, &s, nullptr);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
      }
      double max_err = 0, max_val = 0;
      for (size_t i = 0; i < sum.size(); ++i) {
        max_err = std::max(max_err, static_cast<double>(std::fabs(sum[i] - whole[i])));
        max_val = std::max(max_val, static_cast<double>(std::fabs(whole[i])));
      }
      EXPECT_LE(max_err, 1e-5 * std::max(1.0, max_val)) << "I=" << inter << " t=" << t;
      EXPECT_GT(max_val, 0.0);
    }
  }
}

// ---- bad inputs: every error names the tensor or field ----

void expect_load_error(const std::string& dir, std::initializer_list<const char*> wants) {
  auto w = load_model(dir);
  ASSERT_FALSE(w.ok());
  for (const char* want : wants)
    EXPECT_NE(w.status().message().find(want), std::string::npos) << "want '" << want << "' in: " << w.status().to_string();
}

const char* kQ = "model.layers.0.self_attn.q_proj.weight";

TEST(Fp8Model, MissingScaleNamesIt) {
  TempDir d;
  make(multi_block_config(), d.path(), DType::f8_e4m3);
  rewrite_checkpoint(d.path(),
                     [](TensorSpec& s, std::vector<uint8_t>&) { return s.name != std::string(kQ) + "_scale_inv"; });
  expect_load_error(d.path(), {"q_proj.weight_scale_inv", "missing", "block scales"});
}

TEST(Fp8Model, WrongScaleShapeNamesBoth) {
  TempDir d;
  make(multi_block_config(), d.path(), DType::f8_e4m3);
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == std::string(kQ) + "_scale_inv") {  // [2, 2] -> [1, 4]
      s.shape = {1, 4};
    }
    (void)b;
    return true;
  });
  expect_load_error(d.path(), {"q_proj.weight_scale_inv", "[1, 4]", kQ, "ceil("});
}

TEST(Fp8Model, NonFiniteOrNonFloatScaleNamesIt) {
  TempDir d;
  make(multi_block_config(), d.path(), DType::f8_e4m3);
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == std::string(kQ) + "_scale_inv") {
      const float nan = std::nanf("");
      std::memcpy(b.data() + 4, &nan, 4);
    }
    return true;
  });
  expect_load_error(d.path(), {"q_proj.weight_scale_inv", "non-finite"});
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>&) {
    if (s.name == std::string(kQ) + "_scale_inv") s.dtype = DType::i32;
    return true;
  });
  expect_load_error(d.path(), {"q_proj.weight_scale_inv", "I32"});
}

TEST(Fp8Model, Fp8TensorWithoutQuantizationConfigNamesIt) {
  TempDir d;
  make(multi_block_config(), d.path(), DType::f8_e4m3);
  nlohmann::json j = nlohmann::json::parse(test::read_bytes(d.file("config.json")));
  j.erase("quantization_config");
  ASSERT_TRUE(write_text_file(d.file("config.json"), j.dump()).is_ok());
  expect_load_error(d.path(), {"F8_E4M3", "quantization_config", "model.layers.0.self_attn."});
}

TEST(Fp8Model, Fp8NormWeightIsRefused) {
  TempDir d;
  make(multi_block_config(), d.path(), DType::f8_e4m3);
  rewrite_checkpoint(d.path(), [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "model.norm.weight") {
      s.dtype = DType::f8_e4m3;
      b.resize(b.size() / 2);
    }
    return true;
  });
  expect_load_error(d.path(), {"model.norm.weight", "F8_E4M3"});
}

TEST(Fp8Quantize, RefusesNonFiniteWeightsAndWrongInputs) {
  TempDir d;
  const std::string bf = make(multi_block_config(), d.file("bf16"), DType::bf16);
  ConvertOptions q;
  auto same = convert_checkpoint(bf, bf, q);
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.status().message().find("must differ"), std::string::npos);
  ConvertOptions dq;
  dq.mode = ConvertOptions::Mode::dequantize;
  auto notfp8 = convert_checkpoint(bf, d.file("x"), dq);
  ASSERT_FALSE(notfp8.ok());
  EXPECT_NE(notfp8.status().message().find("not FP8"), std::string::npos);
  rewrite_checkpoint(bf, [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "model.layers.1.mlp.experts.3.down_proj.weight") {
      const uint16_t inf = 0x7f80;
      std::memcpy(b.data() + 2 * 200, &inf, 2);
    }
    return true;
  });
  auto bad = convert_checkpoint(bf, d.file("y"), q);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("experts.3.down_proj.weight"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("non-finite"), std::string::npos);
}

TEST(Fp8Quantize, QuantizesProjectionsOnly) {
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.0.self_attn.q_proj.weight", 2));
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.0.mlp.experts.7.down_proj.weight", 2));
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.0.mlp.experts.gate_up_proj", 3));
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.0.block_sparse_moe.experts.1.w2.weight", 2));
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.0.mlp.shared_expert.up_proj.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.embed_tokens.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("lm_head.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.0.mlp.gate.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.0.block_sparse_moe.gate.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.0.mlp.shared_expert_gate.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.0.input_layernorm.weight", 1));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.0.self_attn.q_proj.bias", 1));
  // DeepSeek and Step-3: MLA projections and stacked 3-D experts are quantized; the Step-3
  // router, DeepSeek's score bias and MTP embed / head / eh_proj, and a VLM's vision tower are not.
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", 2));
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.3.mlp.shared_experts.down_proj.weight", 2));
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.1.moe.gate_proj.weight", 3));
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.1.self_attn.wq.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.1.moe.gate.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.1.self_attn.inter_norm.weight", 1));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.3.mlp.gate.e_score_correction_bias", 1));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.61.eh_proj.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.61.embed_tokens.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("model.layers.61.shared_head.head.weight", 2));
  EXPECT_TRUE(fp8_quantizes_tensor("model.layers.61.self_attn.q_b_proj.weight", 2));
  EXPECT_FALSE(fp8_quantizes_tensor("vision_model.encoder.layers.0.mlp.fc1.weight", 2));
}

// Every architecture and expert layout survives quantize -> load -> generate.
TEST(Fp8Quantize, EveryArchitectureRoundTrips) {
  for (Arch arch : {Arch::qwen3_moe, Arch::qwen2_moe, Arch::mixtral}) {
    for (ExpertLayout layout : {ExpertLayout::per_expert, ExpertLayout::fused}) {
      TempDir d;
      const std::string bf = make(multi_block_config(arch), d.file("bf16"), DType::bf16, layout);
      ConvertOptions q;
      q.shard_size = 400000;  // several shards
      auto r = convert_checkpoint(bf, d.file("fp8"), q);
      ASSERT_TRUE(r.ok()) << arch_name(arch) << ": " << r.status().to_string();
      EXPECT_GT(r->tensors_converted, 0);
      EXPECT_LT(r->bytes_out, r->bytes_in * 6 / 10);
      auto w = load_model(d.file("fp8"));
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      EXPECT_TRUE((*w)->layers[0].moe.experts[1].down.is_fp8());
      EXPECT_EQ((*w)->layers[0].moe.router.dtype, DType::bf16);
      EXPECT_EQ(greedy(d.file("fp8"), Precision::fast, {5, 6, 7}, 4).size(), 4u);
    }
  }
}

}  // namespace
}  // namespace afd
