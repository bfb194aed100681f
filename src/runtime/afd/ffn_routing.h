// FFN dispatch routing: which FFN worker (slot) gets which token of a micro-batch, which reply
// rows it sends back, and the a2f frame it is sent (FP8 e4m3 activations + the wire header),
// as pure functions over values: no transport, no threads, no clock. FfnClient::dispatch runs
// them (runtime/afd/ffn_client.h, "Membership and expert re-homing" for parts and epochs).
//
// Slots are the FFN workers' bits in the masks (at most 64). A part q is the routed experts
// [q*E/P, (q+1)*E/P); part 0 also holds the shared expert and the dense layers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/protocol.h"
#include "core/status.h"
#include "runtime/topology.h"

namespace afd {

// Who holds what under an applied assignment.
struct FfnRouting {
  std::vector<uint64_t> expert_workers;  // [n_experts]: bit j set = slot j holds a slice of the expert
  uint64_t shared_workers = 0;           // slots holding a slice of the shared expert / dense layers
  bool has_shared = false;               // the model's MoE layers have a shared expert
  std::vector<int16_t> part_of_expert;   // [n_experts]: its part (used at epochs >= 1)
};

// One FFN worker's claim from its handshake: expert range, shared flag, TP rank and degree.
struct ShardClaim {
  int slot = 0;
  ExpertRange range;
};

// The routing masks of `claims` (the assigned slots) over n_experts routed experts. Every
// expert and the shared/dense part must be covered exactly once: one TP degree t per part,
// ranks 0..t-1 each held by one slot; otherwise invalid_argument naming the part and slots.
// Fills expert_workers and shared_workers only.
Status build_routing_masks(std::span<const ShardClaim> claims, int64_t n_experts, FfnRouting* rt);

// [n_experts] -> its part when the experts are cut into `parts` contiguous parts.
std::vector<int16_t> parts_of_experts(int64_t n_experts, int parts);

// The micro-batch to route: n tokens, their top-k expert ids ([n*top_k]) when `moe`.
struct TokenRoutes {
  int64_t n = 0;
  bool moe = false;
  int64_t top_k = 0;                 // K (0 unless moe)
  int64_t n_experts = 0;
  std::span<const int32_t> topk_ids;  // [n*K]
};

// Per token i: workers[i] bit j = slot j gets it (the shared/dense holders on a dense layer or
// when there is a shared expert, the holders of each of its experts); parts[i] bit q = it
// touches part q (bit 0 for the shared/dense part; expert parts only when by_parts).
// invalid_argument for an expert id outside [0, n_experts).
Status route_tokens(const FfnRouting& rt, const TokenRoutes& in, bool by_parts, std::vector<uint64_t>* workers,
                    std::vector<uint64_t>* parts);

// The token rows slot j gets, in token order.
void rows_of_slot(std::span<const uint64_t> workers, int slot, std::vector<int32_t>* rows);

// The token of each row of slot j's reply: `rows` when it holds at most one part (or not by
// parts); else, part by part in [part_begin, part_end), the tokens of `rows` that touch it.
void reply_rows_of_slot(std::span<const int32_t> rows, std::span<const uint64_t> parts, bool by_parts, int part_begin,
                        int part_end, std::vector<int32_t>* reply_rows);

// What the a2f frame of one (layer, micro-batch) says besides its rows.
struct A2fFrame {
  uint32_t layer = 0;
  uint16_t microbatch = 0;
  uint64_t step = 0;
  uint32_t epoch = 0;
  int64_t hidden = 0;  // H
  int64_t top_k = 0;   // K (0: dense layer, no ids or weights)
  comm::ScaleGranularity granularity = comm::ScaleGranularity::per_token;
  bool payload_checksum = false;
};

// Writes the a2f frame holding tokens `rows` of h ([n, H] row-major) to `out` (header, then
// the payload of comm::a2f_layout): each row quantised to FP8 e4m3 with one scale per token
// or per 128 channels, and its top-k ids and weights ([n*K] each) when K > 0. `out` must hold
// kFrameHeaderBytes + a2f_layout(rows.size(), H, K, g).total bytes. Returns that size.
Result<size_t> encode_a2f(const A2fFrame& f, std::span<const int32_t> rows, const float* h, const int32_t* topk_ids,
                          const float* topk_w, uint8_t* out);

}  // namespace afd
