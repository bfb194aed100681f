// ScratchArena: working memory that a caller owns and passes down to kernels, in place of
// thread_local buffers, so that who holds the memory and for how long is visible at the call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/check.h"

namespace afd {

// One thread's scratch: a stack of allocations in 64-byte aligned blocks that are kept between
// uses. What is taken inside a Frame is given back when the Frame ends; when the outermost Frame
// ends, a slot that needed several blocks merges them into one, so in steady state every take
// is a pointer bump in one block. Threading: one thread at a time.
class ScratchSlot {
 public:
  // Marks the slot's top; its destructor gives back everything taken since. Frames nest (a
  // caller's frame around a kernel's).
  class Frame {
   public:
    explicit Frame(ScratchSlot& s) : s_(s), block_(s.block_), used_(s.used_) { ++s.depth_; }
    ~Frame() { s_.release(block_, used_); }
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;

   private:
    ScratchSlot& s_;
    size_t block_, used_;
  };

  // Room for n values of T, 64-byte aligned, contents unspecified; valid until the innermost
  // Frame open at the call ends. Only inside a Frame.
  template <class T>
  T* take(size_t n) {
    static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 64);
    AFD_CHECK(depth_ > 0, "ScratchSlot::take outside a Frame");
    return static_cast<T*>(take_bytes(n * sizeof(T)));
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  struct Block {
    std::unique_ptr<void, Free> p;
    size_t size = 0;
  };
  static constexpr size_t kMinBlock = 64 * 1024;

  void* take_bytes(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    while (block_ < blocks_.size() && used_ + bytes > blocks_[block_].size) {
      ++block_;
      used_ = 0;
    }
    if (block_ == blocks_.size()) {
      const size_t size = std::max({bytes, kMinBlock, blocks_.empty() ? 0 : 2 * blocks_.back().size});
      Block b;
      b.p.reset(std::aligned_alloc(64, size));
      AFD_CHECK(b.p != nullptr, "scratch allocation failed");
      b.size = size;
      blocks_.push_back(std::move(b));
      used_ = 0;
    }
    void* p = static_cast<char*>(blocks_[block_].p.get()) + used_;
    used_ += bytes;
    return p;
  }

  void release(size_t block, size_t used) {
    block_ = block;
    used_ = used;
    if (--depth_ > 0 || blocks_.size() <= 1) return;
    size_t total = 0;
    for (const Block& b : blocks_) total += b.size;
    Block b;
    b.p.reset(std::aligned_alloc(64, total));
    if (b.p == nullptr) return;  // keep the blocks; a take will report a failure
    b.size = total;
    blocks_.clear();
    blocks_.push_back(std::move(b));
  }

  std::vector<Block> blocks_;
  size_t block_ = 0, used_ = 0;  // the top: block index and bytes used in it
  int depth_ = 0;                // open Frames
};

// One slot per thread that works at the same time: for work spread over a ThreadPool, slot t
// belongs to the pool's thread t (the `thread` argument of ThreadPool::run / parallel_for),
// so an arena for a pool has pool.size() slots. Threading: distinct slots from distinct
// threads at once.
class ScratchArena {
 public:
  explicit ScratchArena(int n_slots = 1) : slots_(static_cast<size_t>(std::max(n_slots, 1))) {}
  int size() const { return static_cast<int>(slots_.size()); }
  // Grows the arena to at least n_slots slots (for a caller whose pool is known only at the
  // call); the slots it had keep their memory. References to slots taken before are invalidated.
  void reserve_slots(int n_slots) {
    if (n_slots > size()) slots_.resize(static_cast<size_t>(n_slots));
  }
  ScratchSlot& slot(int i) {
    AFD_CHECK(i >= 0 && i < size(), "ScratchArena: no slot for this thread");
    return slots_[static_cast<size_t>(i)];
  }

 private:
  std::vector<ScratchSlot> slots_;
};

}  // namespace afd
