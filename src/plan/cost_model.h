// Decode cost model of the Step-3 paper, §4: per-token work (Tables 2-3), unit costs (Table 5),
// cost per 1M decoded tokens of the attention and FFN parts (Table 6), and the cheapest
// AFD / single-accelerator deployments (Observation 1). Pure functions of their inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "plan/accelerator.h"
#include "plan/model_spec.h"

namespace afd::plan {

// Work per decoded token at a given context length (the Step-3 paper, Tables 2-3 columns).
struct TokenCost {
  int64_t context = 0;
  double kv_bytes = 0;      // KV cache / linear-attention state bytes accessed
  double attn_flops = 0;    // core attention, without linear projections
  double linear_flops = 0;  // projections before and after attention
  double ffn_flops = 0;     // activated FFN
  // Arithmetic intensity of the core attention, FLOPs per KV byte (the Step-3 paper, §5.1).
  double attn_intensity() const { return kv_bytes > 0 ? attn_flops / kv_bytes : 0; }
};
TokenCost decode_token_cost(const ModelSpec& m, int64_t context);

// Step-3 paper, Table 5: USD per FLOP (at model_flops()) and per byte of memory traffic, for a
// card fully utilised over the hour it is paid for.
struct UnitCost {
  double usd_per_flop = 0;
  double usd_per_byte = 0;
};
// Fails (invalid_argument) when the accelerator has no price.
Result<UnitCost> unit_cost(const Accelerator& a);

// USD per decoded token: attention = max(attn FLOPs * U_flop, KV bytes * U_byte) + linear FLOPs
// * U_flop; FFN = FFN FLOPs * U_flop (compute bound under AFD).
double attention_cost_per_token(const TokenCost& t, const UnitCost& u);
double ffn_cost_per_token(const TokenCost& t, const UnitCost& u);

// One (model, context) row of a cost comparison across accelerators.
struct CostRow {
  std::string model;     // ModelSpec::id
  std::string display;
  TokenCost token;
  std::vector<std::string> accelerators;              // ids, in input order
  std::vector<std::optional<double>> attn_usd_per_m;  // per accelerator; nullopt = no price
  std::vector<std::optional<double>> ffn_usd_per_m;
  // Cheapest AFD pairing: attention on one accelerator, FFN on another (may be the same).
  std::string afd_attn, afd_ffn;
  std::optional<double> afd_usd_per_m;
  // Cheapest single-accelerator deployment (attention + FFN on the same card type).
  std::string single;
  std::optional<double> single_usd_per_m;
};
CostRow cost_row(const ModelSpec& m, int64_t context, const std::vector<Accelerator>& accs);

}  // namespace afd::plan
