// WorkerLock (comm/ucx/worker_lock.h): its single-threaded rules, then a stress test with
// the roles of a real transport running at once — a progress thread that parks as told,
// waiters that drive and hand off, posters that queue work — checking mutual exclusion
// (a counter only holders touch, plain non-atomic memory), that every hand-off and every
// queued item is acted on, and that nothing deadlocks. Deadlines are generous (tens of
// seconds for work that takes well under one) so a loaded machine cannot fail it; run it
// under ThreadSanitizer too (scripts/test-sanitizers.sh).
#include "comm/ucx/worker_lock.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/timer.h"

namespace afd::comm::ucx {
namespace {

struct Flags {
  std::atomic<int> queued{0};
  std::atomic<bool> stop{false};
};

TEST(WorkerLock, TryLockIsExclusiveAndNotRecursive) {
  Flags f;
  WorkerLock l(f.queued, f.stop);
  ASSERT_TRUE(l.init().is_ok());
  EXPECT_FALSE(l.held_by_me());
  ASSERT_TRUE(l.try_lock());
  EXPECT_TRUE(l.held_by_me());
  EXPECT_TRUE(l.locked());
  EXPECT_FALSE(l.try_lock());  // not recursive
  bool other_got_it = true, other_holds = true;
  std::thread([&] {
    other_got_it = l.try_lock();
    other_holds = l.held_by_me();
  }).join();
  EXPECT_FALSE(other_got_it);
  EXPECT_FALSE(other_holds);
  l.unlock();
  EXPECT_FALSE(l.locked());
  EXPECT_FALSE(l.held_by_me());
}

TEST(WorkerLock, GuardSkipsLockingWhenThisThreadHolds) {
  Flags f;
  WorkerLock l(f.queued, f.stop);
  ASSERT_TRUE(l.init().is_ok());
  {
    WorkerLock::Guard g(l);
    EXPECT_TRUE(l.held_by_me());
    {
      WorkerLock::Guard inner(l);  // a callback inside the holder's call: must not self-deadlock
      EXPECT_TRUE(l.held_by_me());
    }
    EXPECT_TRUE(l.held_by_me());  // the inner guard did not unlock
  }
  EXPECT_FALSE(l.locked());
}

TEST(WorkerLock, LockRaisesWantedWhileItWaits) {
  Flags f;
  WorkerLock l(f.queued, f.stop);
  ASSERT_TRUE(l.init().is_ok());
  ASSERT_TRUE(l.try_lock());
  std::atomic<bool> got{false};
  std::thread t([&] {
    l.lock();
    got = true;
    l.unlock();
  });
  const int64_t deadline = now_ns() + 30'000'000'000;
  while (!l.wanted() && now_ns() < deadline) std::this_thread::yield();
  EXPECT_TRUE(l.wanted());
  EXPECT_FALSE(got.load());
  l.unlock();
  t.join();
  EXPECT_TRUE(got.load());
  EXPECT_FALSE(l.wanted());
}

TEST(WorkerLock, ShouldParkFollowsItsRules) {
  Flags f;
  WorkerLock l(f.queued, f.stop);
  ASSERT_TRUE(l.init().is_ok());
  EXPECT_FALSE(l.should_park());  // nothing happened: drive

  // A short wait took the worker: park one period, then drive again.
  ASSERT_TRUE(l.try_lock());
  l.note_drive();
  l.unlock();
  EXPECT_TRUE(l.should_park());
  EXPECT_FALSE(l.should_park());

  // A joined waiter keeps the progress thread parked, even with work queued.
  l.join();
  f.queued = 1;
  EXPECT_TRUE(l.should_park());
  EXPECT_TRUE(l.leave(/*joined=*/true));  // the last one
  // Work queued and nobody joined to run it: drive.
  EXPECT_FALSE(l.should_park());
  f.queued = 0;

  // A hand-off wins over a joined waiter, and is consumed by the look that sees it.
  l.join();
  l.request_handoff();
  EXPECT_FALSE(l.should_park());
  EXPECT_TRUE(l.should_park());  // consumed; the waiter is still joined
  EXPECT_TRUE(l.leave(true));

  // leave() reports the last waiter only; one that never joined counts as last.
  l.join();
  l.join();
  EXPECT_FALSE(l.leave(true));
  EXPECT_TRUE(l.leave(true));
  EXPECT_TRUE(l.leave(false));
}

bool wake_fd_readable(const WorkerLock& l) {
  pollfd p{l.wake_fd(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

TEST(WorkerLock, HandOffOverridesAShortWaitAndWakesOnlyASleeper) {
  Flags f;
  WorkerLock l(f.queued, f.stop);
  ASSERT_TRUE(l.init().is_ok());
  // A short wait moved the epoch: without a hand-off the progress thread would park.
  ASSERT_TRUE(l.try_lock());
  l.note_drive();
  l.unlock();
  l.hand_off();
  EXPECT_FALSE(wake_fd_readable(l));  // nobody sleeps: no write
  EXPECT_FALSE(l.should_park());      // the hand-off wins over the moved epoch

  // A sleeping progress thread (begin_sleep) is woken through the fd.
  l.begin_sleep();
  l.hand_off();
  EXPECT_TRUE(wake_fd_readable(l));
  l.drain_wake_fd();
  l.end_sleep();
  EXPECT_FALSE(wake_fd_readable(l));
  l.wake();  // not sleeping: no write
  EXPECT_FALSE(wake_fd_readable(l));
  l.wake_always();
  EXPECT_TRUE(wake_fd_readable(l));
  l.drain_wake_fd();
}

TEST(WorkerLock, ParkReturnsWithinItsTimeoutWithoutAWake) {
  Flags f;
  WorkerLock l(f.queued, f.stop);
  ASSERT_TRUE(l.init().is_ok());
  l.join();  // a joined waiter: park() sleeps
  for (int i = 0; i < 20; ++i) l.park();  // returns (bounded by kParkTimeoutUs each)
  EXPECT_TRUE(l.leave(true));
  // Behind a holder: sleeps only while the lock is held, and raises the hand-off.
  l.park_behind_holder();
  EXPECT_FALSE(l.should_park());
}

// Every role at once. Posters queue items (count them in `queued`, then wake); the
// progress thread and the waiters drain the queue only while holding the lock; waiters
// hand off when they leave with items queued. All threads also bump a plain counter under
// the lock. At the end every item was drained and the counter equals the number of
// critical sections entered.
TEST(WorkerLock, StressAllRolesAtOnce) {
  Flags f;
  WorkerLock l(f.queued, f.stop);
  ASSERT_TRUE(l.init().is_ok());
  constexpr int kPosters = 3, kWaiters = 3, kItemsPerPoster = 100000, kWaitsPerWaiter = 50000;

  uint64_t guarded = 0;               // touched only under the lock (non-atomic on purpose)
  int64_t drained = 0;                // likewise
  std::atomic<uint64_t> entered{0};   // critical sections entered, all roles
  std::atomic<int> inside{0};         // threads inside a critical section: must stay <= 1
  std::atomic<bool> overlap{false};

  auto critical = [&](auto&& body) {
    if (inside.fetch_add(1) != 0) overlap = true;
    ++guarded;
    body();
    inside.fetch_sub(1);
    entered.fetch_add(1, std::memory_order_relaxed);
  };
  auto drain = [&] {
    const int n = f.queued.exchange(0, std::memory_order_acq_rel);
    drained += n;
  };

  std::thread progress([&] {
    while (!f.stop.load()) {
      if (l.should_park()) {
        l.park();
        continue;
      }
      if (!l.try_lock()) {
        l.park_behind_holder();
        continue;
      }
      critical(drain);
      l.unlock();
      std::this_thread::yield();
    }
  });

  std::vector<std::thread> threads;
  for (int p = 0; p < kPosters; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < kItemsPerPoster; ++i) {
        if ((i + p) % 7 == 0) {
          WorkerLock::Guard g(l);  // a registration-like holder (waits with lock())
          critical([] {});
        }
        f.queued.fetch_add(1, std::memory_order_seq_cst);
        l.wake();
        if (i % 64 == 0) std::this_thread::yield();
      }
    });
  }
  for (int w = 0; w < kWaiters; ++w) {
    threads.emplace_back([&] {
      for (int i = 0; i < kWaitsPerWaiter; ++i) {
        const bool join = i % 3 == 0;  // some waits are long enough to join, most are short
        if (join) l.join();
        bool held = false;
        for (int turn = 0; turn < 8; ++turn) {
          if (!held && (held = l.try_lock())) l.note_drive();
          if (held) critical(drain);
          if (held && (turn % 4 == 3 || l.wanted())) {
            l.unlock();
            held = false;
          }
          cpu_relax();
        }
        if (held) l.unlock();
        if (l.leave(join) && f.queued.load(std::memory_order_acquire) > 0) l.hand_off();
      }
    });
  }
  for (auto& t : threads) t.join();

  // Everything posted must be drained by the progress thread without further help.
  const int64_t deadline = now_ns() + 60'000'000'000;
  bool all_drained = false;
  while (now_ns() < deadline) {
    {
      WorkerLock::Guard g(l);
      all_drained = f.queued.load() == 0;
    }
    if (all_drained) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  f.stop = true;
  l.wake_always();
  progress.join();

  EXPECT_TRUE(all_drained);
  EXPECT_FALSE(overlap.load());
  EXPECT_EQ(guarded, entered.load());
  EXPECT_EQ(drained, int64_t{kPosters} * kItemsPerPoster);
  EXPECT_FALSE(l.locked());
  EXPECT_FALSE(l.wanted());
}

}  // namespace
}  // namespace afd::comm::ucx
