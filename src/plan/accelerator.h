// Accelerator: the numbers the cost model and the hardware analysis need about one card.
// Presets: the Step-3 paper, Table 4 (H800, H20, A800, 910B) plus H100, H200, L20, L4 from vendor
// datasheets (docs/PLANNING.md cites each value). Or a JSON file (format below).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace afd::plan {

struct Accelerator {
  std::string id;                      // "h800"
  std::string display;                 // "NVIDIA H800"
  std::optional<double> usd_per_hour;  // price per card-hour; unset = unknown (cost columns n/a)
  double flops_bf16 = 0;               // dense BF16/FP16 FLOP/s
  double flops_fp8 = 0;                // dense FP8 FLOP/s; 0 = not supported
  double mem_bw = 0;                   // HBM/GDDR bandwidth, bytes/s
  double mem_bytes = 0;                // memory capacity, bytes
  double net_bw = 0;                   // scale-out NIC bandwidth per card, bytes/s
  int cards_per_server = 8;
  std::string source;                  // where the numbers come from

  // FLOP/s used for an FP8-quantised model: FP8 where supported, else BF16/FP16 with INT8
  // weights/KV (the Step-3 paper, §4.1: memory traffic unchanged, compute in BF16).
  double model_flops() const { return flops_fp8 > 0 ? flops_fp8 : flops_bf16; }
  // Compute-bandwidth ratio (roofline), FLOPs per byte (the Step-3 paper, Table 4 last column).
  double roofline() const { return model_flops() / mem_bw; }
  Status validate() const;
};

std::vector<Accelerator> accelerator_presets();
// By id (case-insensitive): h800, h20, a800, 910b, h100, h200, l20, l4.
Result<Accelerator> find_accelerator(const std::string& name);

// JSON: one object or an array of objects with keys
//   id (string, required), display, usd_per_hour, flops_bf16, flops_fp8, mem_bw (bytes/s),
//   mem_bytes, net_bw (bytes/s per card), cards_per_server, source.
// Errors name the file and the field.
Result<std::vector<Accelerator>> parse_accelerators_json(const std::string& text, const std::string& source);
Result<std::vector<Accelerator>> load_accelerators_file(const std::string& path);

// Resolves a comma list of names: each a preset id or a path to a JSON file.
Result<std::vector<Accelerator>> resolve_accelerators(const std::vector<std::string>& names);

}  // namespace afd::plan
