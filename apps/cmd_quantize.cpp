// afd quantize: converts a checkpoint to FP8 block quantization, or back (model/quantize.h).
//   afd quantize --fp8 --model IN --out OUT [--shard-size BYTES]
//   afd quantize --dequantize [--dtype f32|bf16] --model IN --out OUT [--shard-size BYTES]
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "engine_flags.h"
#include "model/quantize.h"

namespace afd::cli {

namespace {

struct QuantizeFlags {
  bool fp8 = false, dequantize = false;
  std::string model, out, dtype = "f32";
  uint64_t shard_size = 2'000'000'000;
};

void run(const QuantizeFlags& f) {
  if (f.fp8 == f.dequantize) fail("quantize", "give exactly one of --fp8 and --dequantize");
  ConvertOptions opt;
  opt.mode = f.fp8 ? ConvertOptions::Mode::fp8_block : ConvertOptions::Mode::dequantize;
  opt.shard_size = f.shard_size;
  if (f.dtype == "f32") opt.dequantize_dtype = DType::f32;
  else if (f.dtype == "bf16") opt.dequantize_dtype = DType::bf16;
  else fail("quantize", "--dtype '" + f.dtype + "': expected f32 or bf16");
  const auto t0 = std::chrono::steady_clock::now();
  auto rep = convert_checkpoint(f.model, f.out, opt);
  if (!rep.ok()) fail("quantize", rep.status().to_string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %lld tensors %s, %lld copied; %.1f MB of tensors -> %.1f MB, %zu file(s), %.2f s\n",
              f.out.c_str(), static_cast<long long>(rep->tensors_converted), f.fp8 ? "quantized to FP8 blocks" : "dequantized",
              static_cast<long long>(rep->tensors_copied), static_cast<double>(rep->bytes_in) / 1e6,
              static_cast<double>(rep->bytes_out) / 1e6, rep->files.size(), secs);
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto f = std::make_shared<QuantizeFlags>();
  auto* cmd = app.add_subcommand("quantize",
                                 "Convert a checkpoint to FP8 block quantization (e4m3, 128x128 float32 scales) or back");
  cmd->add_flag("--fp8", f->fp8, "quantize the projections to FP8 blocks (embeddings, LM head, routers stay)");
  cmd->add_flag("--dequantize", f->dequantize, "turn an FP8 block checkpoint into --dtype weights");
  cmd->add_option("--model", f->model, "input model directory")->required();
  cmd->add_option("--out", f->out, "output directory (not the input)")->required();
  cmd->add_option("--dtype", f->dtype, "--dequantize: f32 | bf16")->capture_default_str();
  cmd->add_option("--shard-size", f->shard_size, "bytes per safetensors shard")->capture_default_str();
  cmd->callback([f] { run(*f); });
}

}  // namespace afd::cli
