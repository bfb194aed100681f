// Expert-parallel load balancing (EPLB): where the routed experts of each MoE layer, plus R
// redundant replicas of the hottest ones, go on y FFN workers so that every worker gets about
// the same number of tokens. The method of DeepSeek's "Expert Parallelism Load Balancer"
// (global policy), per layer, from tokens counted per (layer, expert) over a window:
//   1. replicate: R times, give one more replica to the expert with the most tokens per
//      replica (an expert's tokens are split evenly over its replicas);
//   2. pack: the E + R replicas, heaviest first, each onto the least-loaded worker that has a
//      free slot and does not hold that expert yet (every worker holds (E + R) / y replicas, so
//      every worker holds the same expert memory);
//   3. refine: while swapping one replica of the most-loaded worker with one of another worker
//      lowers the larger of the two loads, swap (at most 4y passes and 2^27 pairs looked at).
// Load is predicted, not measured: a replica's load is its expert's count / its replica count
// (the tokens of an expert split evenly over its replicas). docs/PLANNING.md "Expert placement
// (EPLB)".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace afd::plan {

// Tokens routed to each expert of each MoE layer over a window (top-k: a token counts once for
// each expert it is routed to). Layers are listed in ascending layer id; every row has n_experts
// finite, non-negative counts.
struct ExpertCounts {
  int64_t n_experts = 0;
  std::vector<int64_t> layer_ids;            // [L] model layer index of each row
  std::vector<std::vector<double>> counts;   // [L][n_experts]
  Status validate() const;
};

// Parses a counts file, either
//   JSON: {"n_experts": E, "layers": [{"layer": l, "counts": [c_0, .., c_{E-1}]}, ...]}
//   (or a bare array of rows, layer ids 0..L-1), or
//   Prometheus text as FFN workers' /metrics write it: afd_ffn_routed_experts (E) and
//   afd_ffn_expert_tokens_total{layer="l",expert="e"} samples (other series are skipped;
//   samples of one (layer, expert) from several workers are added; a pair without a sample
//   counted 0; the layers are those with a sample).
// Errors (corrupt_data, naming `source` and the layer/expert): no layers, rows of different
// lengths, a negative or non-finite count, a repeated layer, an expert id >= E, no E.
Result<ExpertCounts> parse_expert_counts(const std::string& text, const std::string& source);
Result<ExpertCounts> load_expert_counts(const std::string& path);

// The counts are those of the model `m`: E equal to its routed experts, and a row for each of
// its MoE layers and for no other layer. invalid_argument naming the first layer missing or
// extra otherwise (a placement needs every MoE layer).
Status check_counts_cover_model(const ExpertCounts& c, const ModelConfig& m);

// One layer's placement on y workers.
struct LayerPlacement {
  std::vector<std::vector<int32_t>> worker_experts;  // [y] experts whose replica the worker holds
  std::vector<std::vector<int32_t>> expert_workers;  // [E] workers holding a replica, ascending
  std::vector<double> worker_load;                   // [y] predicted tokens
  double max_load() const;
  double mean_load() const;
  double max_over_mean() const;  // 1 when every load is 0
};

// afd's placement without EPLB: y contiguous parts, worker q holding [q*E/y, (q+1)*E/y)
// (runtime/afd/ffn_routing.h), loads predicted from `counts` ([E]).
LayerPlacement contiguous_placement(const std::vector<double>& counts, int n_workers);

struct EplbOptions {
  int n_workers = 1;        // y
  int64_t redundant = 0;    // R extra replicas per layer; (E + R) % y == 0
};
// Checks y >= 1, 0 <= R, (E + R) divisible by y, (E + R) / y <= E (no worker would need two
// replicas of one expert), E <= 65536 and y * E <= 2^26 (the planner's memory) —
// invalid_argument saying which.
Status check_eplb_options(int64_t n_experts, const EplbOptions& o);

// The EPLB placement of one layer's counts ([E]).
Result<LayerPlacement> eplb_placement(const std::vector<double>& counts, const EplbOptions& o);

// Every expert has at least one replica, no worker holds an expert twice, every worker holds
// the same number of replicas, expert_workers mirrors worker_experts: invalid_argument naming
// the expert or worker otherwise. For a placement read from outside (a file, a peer).
Status check_placement(const LayerPlacement& p, int64_t n_experts);

// The placement of every layer of `counts`.
struct PlacementPlan {
  std::vector<int64_t> layer_ids;
  std::vector<LayerPlacement> layers;
};
Result<PlacementPlan> plan_eplb(const ExpertCounts& counts, const EplbOptions& o);
PlacementPlan plan_contiguous(const ExpertCounts& counts, int n_workers);

// Expert memory per worker: slots_per_worker * expert_bytes * n_layers, and the check that it
// fits `worker_bytes` (resource_exhausted with the bytes needed and available otherwise).
Status check_replica_memory(int64_t n_experts, const EplbOptions& o, int64_t n_layers, double expert_bytes,
                            double worker_bytes);

// A placement plan as JSON text: {"n_workers", "redundant", "layers": [{"layer", "workers":
// [[experts..]..], "load": [..], "max_over_mean"}]}.
std::string placement_to_json(const PlacementPlan& p, int n_workers, int64_t redundant);

}  // namespace afd::plan
