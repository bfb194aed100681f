// Router: places each request on one of several attention workers (data-parallel
// Scheduler + Engine pairs). The cost of placing a request on worker w is
//   token_load(w) + (prompt tokens not covered by a prefix already placed on w),
// so load is balanced by KV tokens rather than request count (stragglers grow with the
// number of attention instances, the A/F ratio paper, §5.3), and a shared prompt prefix goes where
// its KV blocks may already be (the multi-node DeepSeek post, prefix-aware routing). Workers can be added while
// it runs (grow(); an attention worker joining the deployment) and a worker's prefix index
// emptied (forget(); one that left, whose slot a later worker may take). Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <unordered_set>
#include <vector>

#include "core/status.h"

namespace afd::serve {

class PrefixIndex {
 public:
  // block: tokens per hashed block; capacity: remembered block hashes (oldest forgotten).
  PrefixIndex(int64_t block, size_t capacity) : block_(block), capacity_(capacity) {}
  // Number of leading tokens of `tokens` (a multiple of the block) seen before.
  int64_t match(std::span<const int32_t> tokens) const;
  void insert(std::span<const int32_t> tokens);

 private:
  int64_t block_;
  size_t capacity_;
  std::unordered_set<uint64_t> set_;
  std::deque<uint64_t> order_;
};

class Router {
 public:
  // load(w): current token load of worker w (called under the router's lock).
  Router(int n_workers, std::function<int64_t(int)> load, int64_t prefix_block = 16, size_t prefix_capacity = 1 << 16);
  // Chooses a worker for a prompt and records its prefix there.
  int place(std::span<const int32_t> prompt);
  // The same over the workers w with eligible[w]; -1 when none is eligible (nothing is
  // recorded then). Workers beyond eligible.size() are not eligible; an eligible.size()
  // beyond n_workers() grows the router to it first.
  int place(std::span<const int32_t> prompt, const std::vector<bool>& eligible);
  int n_workers() const;
  // Makes it at least n workers (new ones with empty prefix indexes); never shrinks.
  void grow(int n);
  // Empties worker w's prefix index (w < n_workers(); else nothing).
  void forget(int w);

 private:
  void grow_locked(size_t n);  // mu_ held
  mutable std::mutex mu_;
  std::function<int64_t(int)> load_;
  int64_t block_;
  size_t capacity_;
  std::vector<PrefixIndex> prefixes_;
};

}  // namespace afd::serve
