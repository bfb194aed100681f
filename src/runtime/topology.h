// Topology: which workers a bundle has and which experts each FFN worker holds.
//   "mono"  — one process, FFN in the attention worker's thread.
//   "xAyF"  — x attention workers and y FFN workers (e.g. "2A1F"); routed experts split
//             expert-parallel in contiguous ranges, FFN worker i holding
//             [i*E/y, (i+1)*E/y); FFN worker 0 also computes the shared expert and the
//             dense (non-MoE) layers.
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
  bool contains(int64_t e) const { return e >= begin && e < end; }
};

struct Topology {
  Wiring wiring = Wiring::mono;
  int n_attention = 1;
  int n_ffn = 0;
  std::string to_string() const;
  // Expert range of FFN worker `shard` for a model with n_experts routed experts.
  ExpertRange ffn_shard(int shard, int64_t n_experts) const;
};

// Parses "mono", "xAyF" (1 <= x, y <= 64) or "EPn"; errors say what is expected.
Result<Topology> parse_topology(const std::string& s);
// Parses "i/y" (e.g. "0/2") into shard i of y.
Status parse_shard(const std::string& s, int* shard, int* n_shards);

}  // namespace afd
