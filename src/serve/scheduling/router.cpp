#include "serve/scheduling/router.h"

#include <algorithm>

namespace afd::serve {
namespace {

// Chained hash of a block given the previous block's hash (so a block hash names its whole prefix).
uint64_t chain(uint64_t h, std::span<const int32_t> block) {
  for (int32_t t : block) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
  }
  return h;
}

}  // namespace

int64_t PrefixIndex::match(std::span<const int32_t> tokens) const {
  uint64_t h = 0xcbf29ce484222325ULL;
  int64_t n = 0;
  for (size_t off = 0; off + block_ <= tokens.size(); off += block_) {
    h = chain(h, tokens.subspan(off, block_));
    if (!set_.count(h)) break;
    n += block_;
  }
  return n;
}

void PrefixIndex::insert(std::span<const int32_t> tokens) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t off = 0; off + block_ <= tokens.size(); off += block_) {
    h = chain(h, tokens.subspan(off, block_));
    if (set_.insert(h).second) {
      order_.push_back(h);
      if (order_.size() > capacity_) {
        set_.erase(order_.front());
        order_.pop_front();
      }
    }
  }
}

Router::Router(int n_workers, std::function<int64_t(int)> load, int64_t prefix_block, size_t prefix_capacity)
    : load_(std::move(load)), block_(prefix_block), capacity_(prefix_capacity) {
  grow_locked(static_cast<size_t>(std::max(n_workers, 0)));
}

int Router::n_workers() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(prefixes_.size());
}

void Router::grow_locked(size_t n) {
  while (prefixes_.size() < n) prefixes_.emplace_back(block_, capacity_);
}

void Router::grow(int n) {
  std::lock_guard<std::mutex> l(mu_);
  grow_locked(static_cast<size_t>(std::max(n, 0)));
}

void Router::forget(int w) {
  std::lock_guard<std::mutex> l(mu_);
  if (w >= 0 && static_cast<size_t>(w) < prefixes_.size()) prefixes_[w] = PrefixIndex(block_, capacity_);
}

int Router::place(std::span<const int32_t> prompt) {
  return place(prompt, std::vector<bool>(static_cast<size_t>(n_workers()), true));
}

int Router::place(std::span<const int32_t> prompt, const std::vector<bool>& eligible) {
  std::lock_guard<std::mutex> l(mu_);
  grow_locked(eligible.size());
  int best = -1;
  int64_t best_cost = INT64_MAX;
  for (int w = 0; w < static_cast<int>(prefixes_.size()); ++w) {
    if (static_cast<size_t>(w) >= eligible.size() || !eligible[w]) continue;
    int64_t cost = load_(w) + static_cast<int64_t>(prompt.size()) - prefixes_[w].match(prompt);
    if (cost < best_cost) {
      best_cost = cost;
      best = w;
    }
  }
  if (best >= 0) prefixes_[best].insert(prompt);
  return best;
}

}  // namespace afd::serve
