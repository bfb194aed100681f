// Expert placement (--eplb; docs/PROTOCOL.md "Expert placement", docs/DEPLOYMENT.md "Expert
// load balancing"): the attention side decides, per MoE layer, which FFN workers (slots)
// compute each routed expert — several for a hot expert (replicas) — and sends each worker only
// its (token, expert) pairs; every pair comes back as its own BF16 row and the rows of a token
// are added in expert order (the shared expert / dense layer last), so the sum does not depend
// on which worker computed what. Pure functions over values: no transport, no threads, no clock.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "runtime/afd/ffn_routing.h"

namespace afd {

// Which slots compute each routed expert's pairs, per layer.
struct ExpertPlacement {
  int64_t n_experts = 0;
  // [n_layers][n_experts] the slots holding a replica (ascending; empty rows for dense layers).
  std::vector<std::vector<std::vector<int>>> replicas;
};

// Every MoE layer's routed experts in contiguous ranges over `slots` (slot order): expert e on
// slots[e * n / E] — afd's placement without EPLB.
ExpertPlacement contiguous_expert_placement(const ModelConfig& c, std::span<const int> slots);

// Tokens routed to each (layer, expert) pair, decayed: add() counts a micro-batch, decay(f)
// multiplies every count by f (a window that forgets).
class ExpertLoadCounter {
 public:
  explicit ExpertLoadCounter(const ModelConfig& c);
  void add(int64_t layer, std::span<const int32_t> topk_ids);  // ids in [0, E) (checked by routing)
  void decay(double f);
  double total() const { return total_; }
  const std::vector<double>& layer(int64_t l) const { return counts_[static_cast<size_t>(l)]; }

 private:
  std::vector<std::vector<double>> counts_;  // [n_layers][E] (empty rows for dense layers)
  double total_ = 0;
};

// What a plan predicts: the max/mean per-slot load (pairs) of the contiguous placement and
// of the plan, over the layers with counts (the mean of the per-layer ratios), and the worst
// layer's.
struct PlacementPlan {
  ExpertPlacement placement;
  double contiguous_mean = 1, contiguous_worst = 1;
  double planned_mean = 1, planned_worst = 1;
  int64_t redundant = 0;  // replicas beyond one per expert, per layer
};

// The EPLB placement (plan/eplb.h: replicate the hottest experts, pack, refine) of every MoE
// layer from `counts` over `slots`, with `redundant` extra replicas per layer — at most what
// the slots can hold, E (y - 1) (a slot holds an expert once), then rounded up so that (E + R)
// divides over them. invalid_argument for no slot or a negative `redundant`.
Result<PlacementPlan> plan_expert_placement(const ModelConfig& c, const ExpertLoadCounter& counts,
                                            std::span<const int> slots, int64_t redundant);

// One micro-batch routed under a placement, for each slot of `slots`:
struct PlacedSlot {
  std::vector<int32_t> rows;         // the token rows of its frame, ascending
  std::vector<int32_t> ids;          // [n * K]: the pair's expert if it is this slot's, else -1
  std::vector<int32_t> reply_rows;   // the token of each reply row (expert order, shared last)
  std::vector<int32_t> reply_parts;  // the part of each reply row: its expert, E for the shared/dense row
};

// Routes `in` (layer `layer`) under `p` to `slots` (out[i] for slots[i]): each (token, expert)
// pair to one replica of its expert, the replicas taken in turn — turn[e] counts the pairs of
// expert e routed so far (the caller keeps it per layer across micro-batches and steps, so
// that an expert with one pair per micro-batch is split evenly too); the shared/dense holder
// `shared_slot` (one of slots, or -1) gets every token when `shared_rows` (a dense layer, or a
// MoE layer with a shared expert). invalid_argument for an expert id outside [0, E) or an
// expert without a replica among slots.
Status route_placed(const ExpertPlacement& p, int64_t layer, const TokenRoutes& in, std::span<const int> slots,
                    int shared_slot, bool shared_rows, std::vector<int64_t>* turn, std::vector<PlacedSlot>* out);

// out [n, H] = for each token, the sum in f32 of its reply rows (bf16) in part order. replies[i]
// is slot i's reply payload ([rows, H] bf16, rows = out_slots[i].reply_rows.size()).
void sum_placed_replies(std::span<const PlacedSlot> slots, std::span<const uint16_t* const> replies, int64_t n,
                        int64_t H, float* out);

}  // namespace afd
