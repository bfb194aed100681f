// make_model: writes a checkpoint in the exact Hugging Face layout (config.json,
// generation_config.json, model.safetensors or shards + index): random weights for tests and
// benchmarks, or given ones (MakeModelOptions::weights_path, e.g. a model trained elsewhere).
// Weights are streamed to disk in chunks: memory use is O(chunk), not O(model).
//
// Random values are a pure function of (seed, logical tensor name): the per-expert HF name,
// even when the file stores the fused layout. So the per-expert and fused checkpoints of
// one seed hold the same model, and make_model_tensor_values() reproduces any tensor.
// FP8 checkpoints quantize those values per 128x128 block of the stored tensor
// (kernels::quantize_fp8_blocks), 128 rows at a time.
// Init: matrices uniform with std 1/sqrt(in_features) (keeps activations O(1) through the
// layers); norm weights 1 +- 0.1; biases +- 0.05.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"

namespace afd {

enum class ExpertLayout { per_expert, fused };

struct MakeModelOptions {
  std::string out_dir;
  uint64_t seed = 1;
  // bf16 | f16 | f32, or f8_e4m3: FP8 block quantization (128x128 blocks, float32
  // weight_scale_inv, quantization_config in config.json) of the linear projections (attention,
  // experts, shared expert, dense MLP), everything else in bf16.
  DType dtype = DType::bf16;
  ExpertLayout layout = ExpertLayout::per_expert;
  uint64_t shard_size = 2'000'000'000;        // bytes; above it, shards + index.json
  // Non-empty: the values come from this safetensors file (model/tools/weights_file.h: F32, BF16 or
  // F16) instead of the generator, one tensor per logical tensor under its per-expert HF name
  // (Step-3's stacked experts: model.layers.L.moe.experts.j.{gate,up,down}_proj.weight; the
  // fused qwen layout: mlp.experts.j.*), with exactly that tensor's shape. A missing tensor, a
  // wrong shape, a non-finite value or a tensor the model does not have is an error naming it;
  // nothing is written then. They are rounded to `dtype` (or FP8-quantized) as generated values are.
  std::string weights_path;
  // Hook for the serving side: writes tokenizer files into the model directory. Unset: no
  // tokenizer files are written (make-model does not fake one).
  std::function<Status(const ModelConfig& config, const std::string& out_dir)> write_tokenizer;
};

struct MakeModelReport {
  std::vector<std::string> files;  // every file written, in order
  uint64_t tensor_bytes = 0;       // sum of all tensors' bytes
  int64_t n_tensors = 0;           // tensors in the safetensors files
};

// The preset configuration ("tiny" | "small" | "bench") of an architecture. eos 2, bos 1.
Result<ModelConfig> make_preset_config(Arch arch, const std::string& preset);
// The same by model_type name: every arch_name, and kimi_k2 (a deepseek_v3 layout with
// model_type kimi_k2 and Kimi-K2's routing and RoPE settings, docs/MODELS.md B8).
Result<ModelConfig> make_preset_config(const std::string& model_type, const std::string& preset);

// config.json text for `c`, with "architectures", "model_type" and "torch_dtype".
std::string model_config_to_json(const ModelConfig& c, DType dtype);

// Writes the checkpoint of `config` (validated first) into options.out_dir, replacing any
// previous config.json / safetensors there. Errors name the file. With
// num_nextn_predict_layers > 0 (deepseek_v2 / deepseek_v3 only) the MTP modules follow the
// main model as layers n_layers .. n_layers + n - 1 (MODELS.md B7: embed_tokens, enorm, hnorm,
// eh_proj [H, 2H], a decoder layer, shared_head.norm, shared_head.head).
Result<MakeModelReport> make_model(const ModelConfig& config, const MakeModelOptions& options);

// The f32 values make_model draws for logical tensor `name` (per-expert HF name; for
// mixtral the w1/w2/w3 names) before rounding to the file dtype. Empty if the model has no
// such tensor.
std::vector<float> make_model_tensor_values(const ModelConfig& config, uint64_t seed, const std::string& name);

}  // namespace afd
