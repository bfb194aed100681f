// RequestTable: ids, exhaustion, and the lock-free free list under concurrent use.
#include "comm/request_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "core/timer.h"

namespace afd::comm {
namespace {

// Allocates `cap` requests on this thread: every slot comes out, each once, then none.
void ExpectEverySlotFreeOnce(RequestTable& t, uint32_t cap) {
  std::set<uint32_t> slots;
  for (uint32_t i = 0; i < cap; ++i) {
    auto r = t.allocate();
    ASSERT_TRUE(r.ok()) << "slot " << i << " of " << cap << ": " << r.status().to_string();
    slots.insert(RequestTable::slot_of(*r));
  }
  EXPECT_EQ(slots.size(), cap);
  EXPECT_FALSE(t.allocate().ok());
}

// Runs worker(k) for k < n on n threads and joins them; then no errors, nothing in
// flight, and every slot free once.
template <class Worker>
void RunThreadsThenExpectEverySlotFree(RequestTable& t, uint32_t cap, int n, Worker worker,
                                       const std::atomic<int>& errors) {
  std::vector<std::thread> ths;
  for (int k = 0; k < n; ++k) ths.emplace_back(worker, k);
  for (auto& th : ths) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(t.in_flight(), 0u);
  ExpectEverySlotFreeOnce(t, cap);
}

TEST(RequestTable, ExhaustionAndReuseWithNewGeneration) {
  RequestTable t(4);
  std::vector<RequestId> ids;
  for (int i = 0; i < 4; ++i) {
    auto r = t.allocate();
    ASSERT_TRUE(r.ok());
    ids.push_back(*r);
  }
  EXPECT_EQ(t.allocate().status().code(), StatusCode::resource_exhausted);
  EXPECT_EQ(t.in_flight(), 4u);
  t.complete(ids[2], Completion{Status(), 5});
  Completion c;
  ASSERT_TRUE(t.test(ids[2], &c));
  EXPECT_EQ(c.bytes, 5u);
  // The freed slot comes back under a new id; the old one is stale.
  auto again = t.allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, ids[2]);
  EXPECT_EQ(*again & 0xffffffffu, ids[2] & 0xffffffffu);
  ASSERT_TRUE(t.test(ids[2], &c));
  EXPECT_EQ(c.status.code(), StatusCode::invalid_argument);
  t.complete(ids[2], Completion{Status(), 9});  // stale: ignored
  EXPECT_TRUE(t.is_pending(*again));
}

// An operation that finished inside its post call gets a slot-less id: done, successful,
// with its byte count, every time it is looked at; nothing in the table is touched.
TEST(RequestTable, FinishedIdsNeedNoSlot) {
  RequestTable t(1);
  auto held = t.allocate();
  ASSERT_TRUE(held.ok());
  RequestId f = RequestTable::finished_id(4096);
  EXPECT_TRUE(RequestTable::is_finished_id(f));
  EXPECT_FALSE(RequestTable::is_finished_id(*held));
  EXPECT_FALSE(t.is_pending(f));
  t.complete(f, Completion{cancelled("late"), 0});  // ignored
  for (int i = 0; i < 2; ++i) {
    Completion c;
    ASSERT_TRUE(t.test(f, &c));
    EXPECT_TRUE(c.status.is_ok());
    EXPECT_EQ(c.bytes, 4096u);
  }
  RequestId both[2] = {*held, f};
  EXPECT_EQ(t.poll_any(both), 1);
  EXPECT_EQ(t.wait_any(both, now_ns()), 1);
  EXPECT_TRUE(t.wait(f, now_ns()).status.is_ok());
  // The one real slot is still the held request's.
  EXPECT_EQ(t.allocate().status().code(), StatusCode::resource_exhausted);
  EXPECT_TRUE(t.is_pending(*held));
}

TEST(RequestTable, ConcurrentAllocateCompleteRelease) {
  // Threads allocate, complete (half through callbacks, which free the slot inside
  // complete) and consume requests on a small table, so slots are recycled constantly.
  constexpr uint32_t kCap = 16;
  constexpr int kThreads = 4, kRounds = 20000;
  RequestTable t(kCap, 0);
  std::atomic<int> live_slots[kCap] = {};
  std::atomic<int> callbacks{0}, errors{0};
  auto worker = [&](int seed) {
    for (int i = 0; i < kRounds; ++i) {
      bool cb = (i + seed) % 2 == 0;
      auto r = cb ? t.allocate([&](const Completion& c) { callbacks.fetch_add(c.bytes == 3 ? 1 : 0); })
                  : t.allocate();
      if (!r.ok()) {
        std::this_thread::yield();
        continue;
      }
      uint32_t slot = static_cast<uint32_t>(*r & 0xffffffffu);
      if (live_slots[slot].fetch_add(1) != 0) errors.fetch_add(1);  // two owners of one slot
      live_slots[slot].fetch_sub(1);  // before complete: a callback frees the slot inside it
      t.complete(*r, Completion{Status(), 3});
      if (!cb) {
        Completion c;
        if (!t.test(*r, &c) || !c.status.is_ok() || c.bytes != 3) errors.fetch_add(1);
      }
    }
  };
  RunThreadsThenExpectEverySlotFree(t, kCap, kThreads, worker, errors);
}

// A table large enough for thread caches: slots freed on a thread are reused by it
// without the shared stack, go back to the table when the thread exits, and every slot is
// still handed out exactly once.
TEST(RequestTable, ThreadCachedSlotsComeBackWhenTheThreadExits) {
  constexpr uint32_t kCap = RequestTable::kMinCachedCapacity;
  RequestTable t(kCap, 0);
  std::atomic<int> errors{0};
  auto worker = [&](bool exclusive) {
    // Hold kThreadCacheSlots + 4 at once so that releasing them fills this thread's cache
    // and spills the rest to the shared stack; then churn one at a time.
    std::vector<RequestId> held;
    for (uint32_t i = 0; i < RequestTable::kThreadCacheSlots + 4; ++i) {
      auto r = t.allocate();
      if (!r.ok()) {
        errors.fetch_add(1);
        return;
      }
      held.push_back(*r);
    }
    for (RequestId id : held) {
      if (exclusive) t.complete_exclusive(id, Completion{Status(), 1});
      else t.complete(id, Completion{Status(), 1});
      Completion c;
      if (!t.test(id, &c) || c.bytes != 1) errors.fetch_add(1);
    }
    for (int i = 0; i < 5000; ++i) {
      auto r = t.allocate();
      if (!r.ok()) {
        errors.fetch_add(1);
        return;
      }
      t.complete_exclusive(*r, Completion{Status(), 2});
      t.complete_exclusive(*r, Completion{cancelled("second"), 0});  // ignored: already done
      Completion c;
      if (!t.test(*r, &c) || !c.status.is_ok() || c.bytes != 2) errors.fetch_add(1);
    }
  };
  // The exited threads' cached slots are back: all kCap can be allocated here, each once.
  RunThreadsThenExpectEverySlotFree(t, kCap, 4, [&](int k) { worker(k % 2 == 0); }, errors);
}

// A thread whose cache holds slots of a table that has been destroyed drops them and
// caches the next table's slots instead (a long-lived thread is not stuck with a dead one).
TEST(RequestTable, ThreadCacheMovesOnFromADestroyedTable) {
  constexpr uint32_t kCap = RequestTable::kMinCachedCapacity;
  {
    RequestTable dead(kCap, 0);
    auto r = dead.allocate();
    ASSERT_TRUE(r.ok());
    dead.complete(*r, Completion{Status(), 1});
    Completion c;
    ASSERT_TRUE(dead.test(*r, &c));  // its slot is now in this thread's cache
  }
  RequestTable t(kCap, 0);
  // A slot freed here goes to this thread's cache, now t's: another thread can then get
  // every slot but that one, and this thread gets it back.
  auto first = t.allocate();
  ASSERT_TRUE(first.ok());
  t.complete(*first, Completion{Status(), 1});
  Completion c;
  ASSERT_TRUE(t.test(*first, &c));
  std::set<uint32_t> slots;
  std::thread other([&] {
    for (;;) {
      auto r = t.allocate();
      if (!r.ok()) break;
      slots.insert(RequestTable::slot_of(*r));
    }
  });
  other.join();
  EXPECT_EQ(slots.size(), kCap - 1);
  EXPECT_EQ(slots.count(RequestTable::slot_of(*first)), 0u);
  auto again = t.allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(RequestTable::slot_of(*again), RequestTable::slot_of(*first));
  EXPECT_FALSE(t.allocate().ok());
}

TEST(RequestTable, WaitSeesACompletionFromAnotherThread) {
  RequestTable t(8, 1000);
  auto r = t.allocate();
  ASSERT_TRUE(r.ok());
  std::thread th([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    t.complete(*r, Completion{Status(), 1});
  });
  Completion c = t.wait(*r, now_ns() + 5000000000);
  th.join();
  EXPECT_TRUE(c.status.is_ok());
  EXPECT_EQ(c.bytes, 1u);
}

}  // namespace
}  // namespace afd::comm
