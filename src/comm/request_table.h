// RequestTable: the completion state behind a transport's RequestIds. Implementations
// allocate a request when an operation is posted and complete it from their progress
// thread; callers test / wait on it. Shared by every transport so they wait alike.
//
// Ids are (generation << 32 | slot): a stale or foreign id is detected, never aliased.
// Generations stay below 2^31, so bit 63 is free for finished_id(): an operation that
// completed inside its post call (a small eager send) needs no slot at all; its id carries
// the byte count and reads as done, successfully, every time it is tested (as
// MPI_REQUEST_NULL does) — there is nothing to consume or release.
// Threading: all methods are thread-safe and lock-free except a waiter's sleep (wait /
// wait_any past spin_ns). complete() never blocks on waiters.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

#include "comm/transport.h"

namespace afd::comm {

class RequestTable {
 public:
  // capacity: most requests in flight at once; spin_ns: how long a waiter polls before
  // it sleeps on a condition variable (latency vs CPU).
  explicit RequestTable(uint32_t capacity = 8192, int64_t spin_ns = 20000);

  // A new pending request; resource_exhausted when `capacity` are in flight.
  Result<RequestId> allocate(CompletionFn on_done = {});
  // The slot an id names (< capacity for ids this table issued; not unique over time).
  static uint32_t slot_of(RequestId id) { return static_cast<uint32_t>(id & 0xffffffffu); }
  // The slot generation an id was issued under (ids are gen << 32 | slot).
  static uint32_t gen_of(RequestId id) { return static_cast<uint32_t>(id >> 32); }
  // An id for an operation that already finished successfully with `bytes` (< 2^48), no slot.
  static RequestId finished_id(size_t bytes) { return kFinishedBit | (bytes & kTagMask); }
  static bool is_finished_id(RequestId id) { return (id & kFinishedBit) != 0; }
  // Finishes a pending request (first completion wins; later ones are ignored). If it
  // was allocated with a callback, the callback runs here and the slot is freed.
  void complete(RequestId id, Completion c);
  bool is_pending(RequestId id) const;

  bool test(RequestId id, Completion* out);
  Completion wait(RequestId id, int64_t deadline_ns);
  int wait_any(std::span<const RequestId> ids, int64_t deadline_ns);
  // Index of the first finished id (done, or unknown/stale), -1 if none: no clock, no sleep.
  int poll_any(std::span<const RequestId> ids) const;
  // Requests allocated and not yet released. Counts the slots (O(capacity)): for tests
  // and diagnostics, not the per-message path (which keeps no shared counter).
  size_t in_flight() const;

 private:
  static constexpr RequestId kFinishedBit = RequestId{1} << 63;
  static constexpr uint32_t kGenLimit = 0x80000000u;  // generations are 1 .. kGenLimit - 1
  enum : uint32_t { kFree = 0, kPending = 1, kDone = 2, kCompleting = 3 };
  struct Slot {
    std::atomic<uint32_t> state{kFree};
    std::atomic<uint32_t> gen{1};
    std::atomic<uint32_t> next_free{0};  // free stack link: index + 1 of the slot below, 0 at the bottom
    Completion result;
    CompletionFn on_done;
  };
  Slot* lookup(RequestId id) const;
  void release(uint32_t index);
  bool finished(RequestId id) const;  // done, or unknown/stale id

  std::unique_ptr<Slot[]> slots_;
  uint32_t capacity_;
  int64_t spin_ns_;
  // Free slots: a lock-free stack threaded through Slot::next_free. The word packs
  // (pops so far << 32 | top index + 1, 0 when empty); every pop bumps the count, so a
  // pop that read a top which was popped and pushed back meanwhile fails its
  // compare-exchange instead of installing a stale link (ABA).
  std::atomic<uint64_t> free_head_{0};
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  std::atomic<int> sleepers_{0};
};

}  // namespace afd::comm
