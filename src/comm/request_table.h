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
// wait_any past spin_ns) and a thread's exit (below). complete() never blocks on waiters.
//
// Cost on the message path: the table avoids locked read-modify-writes where it can:
// - Free slots: a table of at least kMinCachedCapacity slots keeps up to kThreadCacheSlots
//   freed slots per thread in a thread-local cache, for that thread's next allocations,
//   without touching the shared free stack. A cache serves one table at a time (the one
//   it was first given a slot of while empty); a thread's cached slots go back to their
//   table when it exits (or are dropped with the table if that is gone first). So at most
//   kThreadCacheSlots x (threads) slots of a table may be free yet unavailable to other
//   threads: small tables (tests of exhaustion) have no cache and stay exact.
// - complete_exclusive(): the claim without an atomic exchange, for transports whose
//   completers of one request are serialized anyway.
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

  // A new pending request; resource_exhausted when `capacity` are in flight. Inline: a
  // slot from the thread cache is taken here; the shared free stack is out of line.
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
  // As complete(), for a caller that guarantees that no other complete() or
  // complete_exclusive() of the same id can run at the same time (e.g. every completer
  // of the transport holds one lock): the claim is a plain load and store.
  void complete_exclusive(RequestId id, Completion&& c);
  bool is_pending(RequestId id) const;

  // test, poll_any, is_pending, complete_exclusive and the thread-cache paths of allocate
  // and release are defined inline below: they sit on every message's path.
  bool test(RequestId id, Completion* out);
  Completion wait(RequestId id, int64_t deadline_ns);
  int wait_any(std::span<const RequestId> ids, int64_t deadline_ns);
  // Index of the first finished id (done, or unknown/stale), -1 if none: no clock, no sleep.
  int poll_any(std::span<const RequestId> ids) const;
  // Requests allocated and not yet released. Counts the slots (O(capacity)): for tests
  // and diagnostics, not the per-message path (which keeps no shared counter).
  size_t in_flight() const;

  // The thread cache's bounds (see the header comment).
  static constexpr uint32_t kThreadCacheSlots = 16;
  static constexpr uint32_t kMinCachedCapacity = 1024;

  ~RequestTable();
  RequestTable(const RequestTable&) = delete;
  RequestTable& operator=(const RequestTable&) = delete;

 private:
  // A thread's cached free slots (header comment). Trivially destructible and constant-
  // initialised, so the message path reads it without an initialisation guard; a thread
  // that first caches a slot arms an exit hook (arm_thread_exit) that gives them back.
  struct ThreadCache {
    uint64_t table = 0;    // uid of the table the cached slots belong to (0: none yet)
    uint64_t removed = 0;  // registry's removal count when `table` was last known to exist
    uint32_t n = 0;
    bool armed = false;  // this thread's exit hook is registered
    uint32_t slots[kThreadCacheSlots] = {};
  };
  // constinit: other translation units read it directly, with no TLS wrapper call.
  static constinit thread_local ThreadCache tls_cache_;
  struct ExitHook;  // a thread_local whose destructor gives tls_cache_'s slots back
  static void arm_thread_exit();
  // Drops the cached slots if the table they belong to has been destroyed.
  static void forget_if_table_gone(ThreadCache& tc);
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
  Result<RequestId> allocate_shared(CompletionFn&& on_done);  // from the shared free stack
  void release(uint32_t index);
  void release_uncached(uint32_t index);  // release's cache bookkeeping, or the shared stack
  void push_free(uint32_t index);  // onto the shared free stack
  RequestId claim(uint32_t index, CompletionFn&& on_done);  // a free slot taken: now pending
  // Completion of a request already claimed (state kCompleting, or pending under an
  // exclusive completer).
  void finish_claimed(Slot* s, RequestId id, Completion&& c);
  void finish_with_callback(Slot* s, RequestId id, Completion&& c);  // s->on_done set
  void wake_sleepers();
  bool finished(RequestId id) const;  // done, or unknown/stale id
  // test() of an id that names no slot of this table any more (unknown, or consumed).
  static Completion unknown_id();

  std::unique_ptr<Slot[]> slots_;
  uint32_t capacity_;
  uint64_t uid_;  // names this table to the thread caches (never reused, unlike its address)
  bool cached_;   // capacity_ >= kMinCachedCapacity
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

inline RequestTable::Slot* RequestTable::lookup(RequestId id) const {
  uint32_t index = slot_of(id);
  if (index >= capacity_) return nullptr;
  Slot* s = &slots_[index];
  if (s->gen.load(std::memory_order_acquire) != gen_of(id)) return nullptr;
  return s;
}

inline Result<RequestId> RequestTable::allocate(CompletionFn on_done) {
  ThreadCache& tc = tls_cache_;
  if (cached_ && tc.n > 0 && tc.table == uid_) return claim(tc.slots[--tc.n], std::move(on_done));
  return allocate_shared(std::move(on_done));
}

inline RequestId RequestTable::claim(uint32_t index, CompletionFn&& on_done) {
  Slot& s = slots_[index];
  // A free slot has no callback (release clears it), and its result is written by
  // complete() before anyone reads it: nothing to reset.
  if (on_done) s.on_done = std::move(on_done);
  s.state.store(kPending, std::memory_order_release);
  return (static_cast<uint64_t>(s.gen.load(std::memory_order_relaxed)) << 32) | index;
}

inline void RequestTable::release(uint32_t index) {
  Slot& s = slots_[index];
  if (s.on_done) s.on_done = nullptr;
  uint32_t g = s.gen.load(std::memory_order_relaxed) + 1;
  if (g >= kGenLimit) g = 1;
  s.gen.store(g, std::memory_order_release);
  s.state.store(kFree, std::memory_order_release);
  ThreadCache& tc = tls_cache_;
  // tc.table is set (to a live table) only after the exit hook was armed.
  if (cached_ && tc.table == uid_ && tc.n < kThreadCacheSlots) {
    tc.slots[tc.n++] = index;
    return;
  }
  release_uncached(index);
}

inline void RequestTable::finish_claimed(Slot* s, RequestId id, Completion&& c) {
  if (s->on_done) {
    finish_with_callback(s, id, std::move(c));
    return;
  }
  s->result = std::move(c);
  s->state.store(kDone, std::memory_order_release);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_sleepers();
}

inline bool RequestTable::is_pending(RequestId id) const {
  Slot* s = lookup(id);
  return s != nullptr && s->state.load(std::memory_order_acquire) == kPending;
}

inline bool RequestTable::finished(RequestId id) const {
  Slot* s = lookup(id);
  return s == nullptr || s->state.load(std::memory_order_acquire) == kDone;
}

inline int RequestTable::poll_any(std::span<const RequestId> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (finished(ids[i])) return static_cast<int>(i);
  }
  return -1;
}

inline bool RequestTable::test(RequestId id, Completion* out) {
  if (is_finished_id(id)) {
    *out = Completion{Status(), static_cast<size_t>(id & kTagMask)};
    return true;
  }
  Slot* s = lookup(id);
  if (s == nullptr) {
    *out = unknown_id();
    return true;
  }
  if (s->state.load(std::memory_order_acquire) != kDone) return false;
  *out = std::move(s->result);
  release(slot_of(id));
  return true;
}

inline void RequestTable::complete_exclusive(RequestId id, Completion&& c) {
  Slot* s = lookup(id);
  // The generation matched, so the slot was not released since this id was issued; only a
  // completion moves it out of pending, and none runs beside this one: it stays ours.
  if (s == nullptr || s->state.load(std::memory_order_acquire) != kPending) return;
  finish_claimed(s, id, std::move(c));
}

}  // namespace afd::comm
