// Topology: which workers a bundle has and which experts each FFN worker holds.
//   "mono"  — one process, FFN in the attention worker's thread.
//   "xAyF"  — x attention workers and y FFN workers (e.g. "2A1F"); routed experts split
//             expert-parallel in contiguous ranges, FFN worker i holding
//             [i*E/y, (i+1)*E/y); FFN worker 0 also computes the shared expert and the
//             dense (non-MoE) layers.
//             With a tensor-parallel degree t dividing y (--ffn-tp t; default 1 = pure EP),
//             FFN worker s is TP rank s % t of EP group s / t: the y/t groups split the
//             experts as above (group g holds [g*E/(y/t), (g+1)*E/(y/t))), and the t ranks
//             of a group each hold rows [r*I/t, (r+1)*I/t) of gate/up and the matching
//             columns of down of every held expert (model/ffn_part.h, slice_ffn_tp). Group
//             0's ranks hold the shared expert and dense layers, TP-sliced the same way.
//   "EPn"   — expert-parallel baseline: n workers, each both attention and FFN for its range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace afd {

enum class Wiring { mono, afd, ep };

struct ExpertRange {
  int64_t begin = 0;  // first expert held
  int64_t end = 0;    // one past the last
  bool holds_shared = false;
  int tp_rank = 0;    // which intermediate slice of the held experts: rows [r*I/t, (r+1)*I/t)
  int tp_degree = 1;  // t; 1 = whole experts
  bool contains(int64_t e) const { return e >= begin && e < end; }
};

struct Topology {
  Wiring wiring = Wiring::mono;
  int n_attention = 1;
  int n_ffn = 0;
  int ffn_tp = 1;  // TP degree t within an EP group; divides n_ffn (not part of to_string())
  std::string to_string() const;
  // Expert range (and TP slice) of FFN worker `shard` for a model with n_experts routed experts.
  ExpertRange ffn_shard(int shard, int64_t n_experts) const;
};

// Worker `shard` of n_ffn with TP degree tp (tp divides n_ffn; 0 <= shard < n_ffn): EP group
// shard / tp of n_ffn / tp holds its contiguous expert range, TP rank shard % tp, shared
// expert / dense layers in group 0.
ExpertRange ffn_shard_range(int shard, int n_ffn, int tp, int64_t n_experts);

// Parses "mono", "xAyF" (1 <= x, y <= 64) or "EPn"; errors say what is expected.
Result<Topology> parse_topology(const std::string& s);
// Parses "i/y" (e.g. "0/2") into shard i of y.
Status parse_shard(const std::string& s, int* shard, int* n_shards);

}  // namespace afd
