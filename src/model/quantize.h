// Checkpoint conversion between bf16/f16/f32 weights and FP8 block quantization (the format of
// model/matrix.h: e4m3 projections with float32 `_scale_inv` block scales and a
// quantization_config in config.json). `afd quantize` is the command-line face.
//
// fp8_block: every 2-D or 3-D floating-point projection tensor — names ending in ".weight", and
//   the fused "experts.gate_up_proj" / "experts.down_proj" — is quantized per 128x128 block
//   (kernels::quantize_fp8_blocks: s = amax / 448, round to nearest even, saturating), except
//   what the format keeps unquantized: model.embed_tokens, lm_head, the routers
//   (mlp.gate / block_sparse_moe.gate) and qwen2_moe's shared_expert_gate. Every other tensor
//   is copied byte for byte. Non-finite weights are refused, naming the tensor.
// dequantize: every F8_E4M3 tensor becomes `dtype` (bf16 or f32) holding fp8 * scale (f32:
//   exact up to one rounding of the product; bf16: that rounded to bf16), its `_scale_inv`
//   partner is dropped and quantization_config removed — a checkpoint that computes the same
//   model without FP8 (tests and accuracy measurements compare the two).
// Other files of the input directory (generation_config.json, tokenizer files) are copied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace afd {

struct ConvertOptions {
  enum class Mode { fp8_block, dequantize };
  Mode mode = Mode::fp8_block;
  DType dequantize_dtype = DType::f32;  // bf16 | f32
  uint64_t shard_size = 2'000'000'000;  // bytes per output shard
};

struct ConvertReport {
  std::vector<std::string> files;  // every file written
  int64_t tensors_converted = 0;   // quantized or dequantized
  int64_t tensors_copied = 0;
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor bytes
};

// Converts the checkpoint in `in_dir` (which must load: load_model) into `out_dir` (created;
// a different directory; its previous safetensors files are replaced). Errors name the
// directory, file and tensor.
Result<ConvertReport> convert_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                         const ConvertOptions& options);

// Whether the fp8_block conversion quantizes the tensor `name` of rank `rank` (rule above).
bool fp8_quantizes_tensor(const std::string& name, size_t rank);

}  // namespace afd
