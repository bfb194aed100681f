#include "kv/block_allocator.h"

#include "core/check.h"

namespace afd {

BlockAllocator::BlockAllocator(int64_t n_blocks) : n_total_(n_blocks), in_use_(n_blocks, 0) {
  free_.reserve(n_blocks);
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int64_t BlockAllocator::allocate() {
  if (free_.empty()) return -1;
  int64_t b = free_.back();
  free_.pop_back();
  in_use_[b] = 1;
  return b;
}

void BlockAllocator::release(int64_t block) {
  AFD_CHECK(block >= 0 && block < n_total_ && in_use_[block], "double free or bad block id");
  in_use_[block] = 0;
  free_.push_back(block);
}

}  // namespace afd
