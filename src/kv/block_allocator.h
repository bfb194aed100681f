// BlockAllocator: a free list of fixed-size KV blocks [0, n_blocks).
// Not thread-safe: owned by the one thread that drives an engine.
#pragma once

#include <cstdint>
#include <vector>

namespace afd {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t n_blocks);
  // Returns a free block id, or -1 when none is left.
  int64_t allocate();
  // Returns a block to the free list. Precondition: it was allocated and not yet freed.
  void release(int64_t block);
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_total() const { return n_total_; }

 private:
  int64_t n_total_;
  std::vector<int64_t> free_;      // stack; lowest ids handed out first
  std::vector<uint8_t> in_use_;
};

}  // namespace afd
