#include "comm/request_table.h"

#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/timer.h"

namespace afd::comm {
namespace {

std::atomic<uint64_t> g_next_uid{1};

// The tables that have a thread cache, by uid: a thread's exit returns its cached slots
// through this, and only while the table still exists.
struct Registry {
  std::mutex mu;
  std::unordered_map<uint64_t, RequestTable*> tables;
  // Bumped when a table leaves: a cache holding slots of another table checks then
  // whether that table is gone (so a long-lived thread's cache is not stuck with it).
  std::atomic<uint64_t> removed{0};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: thread exits may come after static destruction
  return *r;
}

}  // namespace

constinit thread_local RequestTable::ThreadCache RequestTable::tls_cache_{};

struct RequestTable::ExitHook {
  ~ExitHook() {
    ThreadCache& tc = tls_cache_;
    if (tc.n > 0) {
      Registry& r = registry();
      std::lock_guard<std::mutex> lk(r.mu);
      auto it = r.tables.find(tc.table);
      if (it != r.tables.end()) {
        for (uint32_t i = 0; i < tc.n; ++i) it->second->push_free(tc.slots[i]);
      }
    }
    // Still armed: a slot released by a later exit handler of this thread is cached and
    // lost with it (at most kThreadCacheSlots), as the hook cannot be constructed again.
    tc = ThreadCache{};
    tc.armed = true;
  }
};

void RequestTable::arm_thread_exit() {
  thread_local ExitHook hook;  // constructed (and its destructor registered) on first call
  (void)hook;
  tls_cache_.armed = true;
}

void RequestTable::forget_if_table_gone(ThreadCache& tc) {
  Registry& r = registry();
  uint64_t now = r.removed.load(std::memory_order_acquire);
  if (now == tc.removed) return;
  std::lock_guard<std::mutex> lk(r.mu);
  tc.removed = now;
  if (r.tables.count(tc.table) == 0) tc.n = 0;
}

RequestTable::RequestTable(uint32_t capacity, int64_t spin_ns)
    : slots_(new Slot[capacity]),
      capacity_(capacity),
      uid_(g_next_uid.fetch_add(1)),
      cached_(capacity >= kMinCachedCapacity),
      spin_ns_(spin_ns) {
  // Slot 0 on top, then 1, 2, ...
  for (uint32_t i = 0; i + 1 < capacity; ++i) slots_[i].next_free.store(i + 2, std::memory_order_relaxed);
  free_head_.store(capacity > 0 ? 1 : 0, std::memory_order_release);
  if (cached_) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    r.tables.emplace(uid_, this);
  }
}

RequestTable::~RequestTable() {
  if (!cached_) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.tables.erase(uid_);
  r.removed.fetch_add(1, std::memory_order_release);
}

Result<RequestId> RequestTable::allocate_shared(CompletionFn&& on_done) {
  uint32_t index;
  uint64_t head = free_head_.load(std::memory_order_acquire);
  for (;;) {
    uint32_t top = static_cast<uint32_t>(head);
    if (top == 0) {
      return resource_exhausted("transport: more than " + std::to_string(capacity_) +
                                " operations in flight");
    }
    // May read the link of a slot another thread just popped: then the count moved and
    // the exchange below fails.
    uint32_t below = slots_[top - 1].next_free.load(std::memory_order_relaxed);
    uint64_t popped = (((head >> 32) + 1) << 32) | below;
    if (free_head_.compare_exchange_weak(head, popped, std::memory_order_acquire, std::memory_order_acquire)) {
      index = top - 1;
      break;
    }
  }
  return claim(index, std::move(on_done));
}

void RequestTable::release_uncached(uint32_t index) {
  if (cached_) {
    ThreadCache& tc = tls_cache_;
    if (tc.n > 0 && tc.table != uid_) forget_if_table_gone(tc);
    if (tc.n == 0) {
      if (!tc.armed) arm_thread_exit();
      tc.table = uid_;
    }
    if (tc.table == uid_ && tc.n < kThreadCacheSlots) {
      tc.slots[tc.n++] = index;
      return;
    }
  }
  push_free(index);
}

void RequestTable::push_free(uint32_t index) {
  Slot& s = slots_[index];
  uint64_t head = free_head_.load(std::memory_order_relaxed);
  uint64_t pushed;
  do {
    s.next_free.store(static_cast<uint32_t>(head), std::memory_order_relaxed);
    pushed = (head & ~uint64_t{0xffffffffu}) | (index + 1);
  } while (!free_head_.compare_exchange_weak(head, pushed, std::memory_order_release, std::memory_order_relaxed));
}

void RequestTable::complete(RequestId id, Completion c) {
  Slot* s = lookup(id);
  if (s == nullptr) return;
  // Claim: only one completer proceeds (pending -> completing -> done).
  uint32_t expected = kPending;
  if (!s->state.compare_exchange_strong(expected, kCompleting, std::memory_order_acq_rel)) return;
  if (s->gen.load(std::memory_order_acquire) != gen_of(id)) {
    s->state.store(kPending, std::memory_order_release);  // raced with a reuse: not ours
    return;
  }
  finish_claimed(s, id, std::move(c));
}

Completion RequestTable::unknown_id() {
  return Completion{invalid_argument("transport: unknown or already consumed request id"), 0};
}

void RequestTable::finish_with_callback(Slot* s, RequestId id, Completion&& c) {
  CompletionFn fn = std::move(s->on_done);
  release(slot_of(id));
  fn(c);
}

void RequestTable::wake_sleepers() {
  std::lock_guard<std::mutex> lk(wait_mu_);
  wait_cv_.notify_all();
}

size_t RequestTable::in_flight() const {
  size_t n = 0;
  for (uint32_t i = 0; i < capacity_; ++i) {
    if (slots_[i].state.load(std::memory_order_acquire) != kFree) ++n;
  }
  return n;
}

Completion RequestTable::wait(RequestId id, int64_t deadline_ns) {
  RequestId one[1] = {id};
  Completion c;
  if (wait_any(one, deadline_ns) < 0) {
    return Completion{timeout_error("transport: operation did not finish before its deadline"), 0};
  }
  test(id, &c);
  return c;
}

int RequestTable::wait_any(std::span<const RequestId> ids, int64_t deadline_ns) {
  int64_t spin_until = now_ns() + spin_ns_;
  for (;;) {
    int r = poll_any(ids);
    if (r >= 0) return r;
    int64_t t = now_ns();
    if (t >= deadline_ns) return -1;
    if (t >= spin_until) break;
    std::this_thread::yield();
  }
  std::unique_lock<std::mutex> lk(wait_mu_);
  sleepers_.fetch_add(1, std::memory_order_acq_rel);
  int r;
  for (;;) {
    r = poll_any(ids);
    if (r >= 0) break;
    int64_t t = now_ns();
    if (t >= deadline_ns) break;
    // Bounded sleeps: a completion racing with the sleeper count is seen within 1 ms.
    wait_cv_.wait_for(lk, std::chrono::nanoseconds(std::min<int64_t>(deadline_ns - t, 1000000)));
  }
  sleepers_.fetch_sub(1, std::memory_order_acq_rel);
  return r;
}

}  // namespace afd::comm
