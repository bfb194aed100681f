#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/cpu/linear_fp8.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"

namespace afd {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;
using kernels::kFp8Block;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

// rows [r0, r0 + nr) of a 2-D/3-D floating tensor viewed as [numel / cols, cols], as f32.
void read_rows_f32(const TensorRef& t, int64_t r0, int64_t nr, int64_t cols, float* out) {
  const size_t n = static_cast<size_t>(nr * cols), at = static_cast<size_t>(r0 * cols);
  switch (t.info->dtype) {
    case DType::f32: std::memcpy(out, t.data + at * 4, n * 4); break;
    case DType::bf16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + (at + i) * 2, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::f16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + (at + i) * 2, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    default: break;  // callers pass floating tensors only
  }
}

bool is_float(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Plan {
  std::vector<TensorSpec> specs;
  // Per spec: the source tensor, and what to do with it.
  enum class Op { copy, quantize, scale_of_previous, dequantize };
  std::vector<const TensorRef*> src;
  std::vector<Op> ops;
};

}  // namespace

bool fp8_quantizes_tensor(const std::string& name, size_t rank) {
  if (rank != 2 && rank != 3) return false;
  if (!ends_with(name, ".weight") && !ends_with(name, "experts.gate_up_proj") && !ends_with(name, "experts.down_proj"))
    return false;
  // Only decoder-layer tensors: a VLM's vision tower (step3_vl vision_model.*, vit_*) is not
  // the language model's and stays as it is.
  if (name.rfind("model.layers.", 0) != 0) return false;
  if (ends_with(name, "mlp.gate.weight") || ends_with(name, "block_sparse_moe.gate.weight") ||
      ends_with(name, "moe.gate.weight"))
    return false;  // routers (qwen / DeepSeek, mixtral, Step-3)
  if (ends_with(name, "shared_expert_gate.weight")) return false;
  // DeepSeek MTP modules (model.layers.N, N >= num_hidden_layers): their embedding, head and
  // eh_proj stay unquantized (MODELS.md B2, B7).
  if (ends_with(name, ".embed_tokens.weight") || ends_with(name, "shared_head.head.weight") ||
      ends_with(name, "eh_proj.weight"))
    return false;
  return true;
}

Result<ConvertReport> convert_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                         const ConvertOptions& opt) {
  const bool to_fp8 = opt.mode == ConvertOptions::Mode::fp8_block;
  if (!to_fp8 && opt.dequantize_dtype != DType::bf16 && opt.dequantize_dtype != DType::f32)
    return invalid_argument(std::string("dequantize: dtype ") + dtype_name(opt.dequantize_dtype) + " (expected bf16 or f32)");
  std::error_code ec;
  if (out_dir.empty()) return invalid_argument("no output directory");
  if (fs::exists(out_dir, ec) && fs::equivalent(in_dir, out_dir, ec))
    return invalid_argument(out_dir + ": the output directory must differ from the input " + in_dir);

  // The input must be a model afd loads (shapes, scales, dtypes all checked there).
  AFD_ASSIGN_OR_RETURN(std::shared_ptr<const ModelWeights> model, load_model(in_dir));
  const bool is_fp8 = model->config.weight_quant == WeightQuant::fp8_block;
  if (to_fp8 && is_fp8) return invalid_argument(in_dir + ": already FP8 block-quantized (config.json quantization_config)");
  if (!to_fp8 && !is_fp8) return invalid_argument(in_dir + ": not FP8 block-quantized (no quantization_config), nothing to dequantize");
  const Checkpoint& ck = *model->checkpoint;

  Plan plan;
  for (const std::string& name : ck.tensor_names()) {
    const TensorRef* t = ck.find(name);
    const DType dt = t->info->dtype;
    const std::vector<int64_t>& shape = t->info->shape;
    if (to_fp8 && is_float(dt) && fp8_quantizes_tensor(name, shape.size())) {
      plan.specs.push_back({name, DType::f8_e4m3, shape});
      plan.src.push_back(t);
      plan.ops.push_back(Plan::Op::quantize);
      std::vector<int64_t> ss = shape;
      ss[ss.size() - 2] = blocks(ss[ss.size() - 2]);
      ss.back() = blocks(ss.back());
      plan.specs.push_back({name + "_scale_inv", DType::f32, ss});
      plan.src.push_back(t);
      plan.ops.push_back(Plan::Op::scale_of_previous);
    } else if (!to_fp8 && dt == DType::f8_e4m3) {
      if (shape.size() != 2 && shape.size() != 3)
        return not_supported(*t->file + ": F8_E4M3 tensor '" + name + "' has rank " + std::to_string(shape.size()) +
                             " (block scales need 2 or 3 dimensions)");
      const TensorRef* s = ck.find(name + "_scale_inv");
      if (s == nullptr || !is_float(s->info->dtype) || s->info->shape.size() != shape.size() ||
          s->info->shape[shape.size() - 2] != blocks(shape[shape.size() - 2]) ||
          s->info->shape.back() != blocks(shape.back()) || (shape.size() == 3 && s->info->shape[0] != shape[0])) {
        return invalid_argument(ck.dir() + ": F8_E4M3 tensor '" + name +
                                "' has no '_scale_inv' partner of its block shape");
      }
      plan.specs.push_back({name, opt.dequantize_dtype, shape});
      plan.src.push_back(t);
      plan.ops.push_back(Plan::Op::dequantize);
    } else if (!to_fp8 && ends_with(name, "_scale_inv") && ck.contains(name.substr(0, name.size() - 10)) &&
               ck.find(name.substr(0, name.size() - 10))->info->dtype == DType::f8_e4m3) {
      continue;  // consumed by its weight
    } else {
      plan.specs.push_back({name, dt, shape});
      plan.src.push_back(t);
      plan.ops.push_back(Plan::Op::copy);
    }
  }

  fs::create_directories(out_dir, ec);
  if (ec) return io_error(out_dir + ": cannot create directory: " + ec.message());
  AFD_RETURN_IF_ERROR(remove_checkpoint_tensors(out_dir));

  ConvertReport rep;
  std::vector<float> scales;  // of the last tensor quantized
  auto data = [&](size_t i, const ByteWriter& write) -> Status {
    const TensorRef& t = *plan.src[i];
    const std::vector<int64_t>& shape = t.info->shape;
    switch (plan.ops[i]) {
      case Plan::Op::copy: ++rep.tensors_copied; return write(t.data, t.info->nbytes());
      case Plan::Op::scale_of_previous: return write(scales.data(), scales.size() * sizeof(float));
      case Plan::Op::quantize: {
        ++rep.tensors_converted;
        const int64_t R = shape[shape.size() - 2], C = shape.back(), slabs = shape.size() == 3 ? shape[0] : 1;
        std::vector<float> vals(static_cast<size_t>(kFp8Block * C));
        std::vector<uint8_t> q(vals.size());
        std::vector<float> s(static_cast<size_t>(blocks(C)));
        scales.clear();
        for (int64_t e = 0; e < slabs; ++e)
          for (int64_t r0 = 0; r0 < R; r0 += kFp8Block) {
            const int64_t nr = std::min(kFp8Block, R - r0);
            read_rows_f32(t, e * R + r0, nr, C, vals.data());
            for (int64_t k = 0; k < nr * C; ++k)
              if (!std::isfinite(vals[static_cast<size_t>(k)]))
                return invalid_argument(*t.file + ": tensor '" + t.info->name + "' holds a non-finite weight (row " +
                                        std::to_string(r0 + k / C) + ", column " + std::to_string(k % C) + ")");
            kernels::quantize_fp8_blocks(vals.data(), nr, C, q.data(), s.data());
            AFD_RETURN_IF_ERROR(write(q.data(), static_cast<size_t>(nr * C)));
            scales.insert(scales.end(), s.begin(), s.end());
          }
        return Status();
      }
      case Plan::Op::dequantize: {
        ++rep.tensors_converted;
        const TensorRef* st = ck.find(t.info->name + "_scale_inv");
        const int64_t R = shape[shape.size() - 2], C = shape.back(), slabs = shape.size() == 3 ? shape[0] : 1;
        std::vector<float> row(static_cast<size_t>(C));
        std::vector<uint16_t> row16(row.size());
        std::vector<float> sc(static_cast<size_t>(st->info->numel()));
        read_rows_f32(*st, 0, 1, st->info->numel(), sc.data());
        for (int64_t e = 0; e < slabs; ++e)
          for (int64_t r = 0; r < R; ++r) {
            const kernels::Fp8BlockWeights w{t.data + static_cast<size_t>((e * R + r) * C),
                                             sc.data() + (e * blocks(R) + r / kFp8Block) * blocks(C), blocks(C), 0};
            kernels::dequantize_fp8_blocks(w, 1, C, row.data());
            if (opt.dequantize_dtype == DType::f32) {
              AFD_RETURN_IF_ERROR(write(row.data(), row.size() * sizeof(float)));
            } else {
              for (size_t k = 0; k < row.size(); ++k) row16[k] = f32_to_bf16(row[k]).bits;
              AFD_RETURN_IF_ERROR(write(row16.data(), row16.size() * sizeof(uint16_t)));
            }
          }
        return Status();
      }
    }
    return Status();
  };
  AFD_ASSIGN_OR_RETURN(WrittenCheckpoint wc, write_checkpoint_tensors(out_dir, plan.specs, opt.shard_size, data));
  rep.bytes_out = wc.tensor_bytes;
  rep.bytes_in = ck.total_bytes();

  // config.json: the input's, with quantization_config added or removed.
  const std::string cfg_in = in_dir + "/config.json";
  AFD_ASSIGN_OR_RETURN(std::string text, read_text(cfg_in));
  ordered_json cfg = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) return invalid_argument(cfg_in + ": not a JSON object");
  if (to_fp8) {
    ordered_json q;
    q["activation_scheme"] = "dynamic";
    q["fmt"] = "e4m3";
    q["quant_method"] = "fp8";
    q["weight_block_size"] = {kFp8Block, kFp8Block};
    cfg["quantization_config"] = q;
  } else {
    cfg.erase("quantization_config");
    if (opt.dequantize_dtype == DType::f32) cfg["torch_dtype"] = "float32";
  }
  const std::string cfg_out = out_dir + "/config.json";
  AFD_RETURN_IF_ERROR(write_text_file(cfg_out, cfg.dump(2) + "\n"));
  rep.files.push_back(cfg_out);

  // Everything else beside the weights (generation config, tokenizer) as it is.
  for (const auto& entry : fs::directory_iterator(in_dir, ec)) {
    if (!entry.is_regular_file()) continue;
    const std::string n = entry.path().filename().string();
    if (n == "config.json" || n == kSafetensorsIndexName || ends_with(n, ".safetensors")) continue;
    fs::copy_file(entry.path(), fs::path(out_dir) / n, fs::copy_options::overwrite_existing, ec);
    if (ec) return io_error(entry.path().string() + ": cannot copy to " + out_dir + ": " + ec.message());
    rep.files.push_back((fs::path(out_dir) / n).string());
  }
  rep.files.insert(rep.files.end(), wc.files.begin(), wc.files.end());
  return rep;
}

}  // namespace afd
