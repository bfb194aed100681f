// WorkerLock: which thread drives a UCS_THREAD_MODE_SINGLE ucp worker, and how that job is
// handed between the transport's progress thread and the caller threads.
//
// Roles
// - Holder: a thread holding the lock may call into the worker and touch everything the
//   transport guards with it. try_lock() never waits (and fails for the holder itself:
//   the lock is not recursive); lock() waits (pause, yield, then short sleeps) and while
//   it waits raises wanted(), which asks a waiter that keeps the lock across its polling
//   turns to let go. held_by_me() tells code that may run inside a holder's call (a UCX
//   callback) whether its thread holds the lock; Guard locks for a scope unless so.
// - Waiter: a caller that drives the worker itself while it waits for its own requests.
//   note_drive() each time it takes the lock; join() once it has waited long enough to
//   count (the progress thread then stays parked until the last one leaves); leave() when
//   done, which says whether this was the last waiter; hand_off() by the last one when
//   work is left in flight or queued (or it gave up).
// - Poster: a holder that leaves an operation in flight without waiting for it calls
//   request_handoff() (no wake: the progress thread sees it at its next look).
// - Progress thread (exactly one): should_park() before each pass; park() when it says
//   so; park_behind_holder() when a caller holds the worker; begin_sleep() / end_sleep()
//   around its own blocking wait, in which wake_fd() must be one of the waited-on fds.
//
// Guarantees
// - Mutual exclusion; a holder sees every write of earlier holders (release/acquire).
// - No lost hand-off: a hand_off() either finds the progress thread awake (it sees the
//   raised hand-off at its next should_park() and runs a pass) or writes wake_fd() so it
//   wakes. Work counted in `queued` while no waiter is joined likewise keeps the progress
//   thread from parking, and wake() after counting it wakes one that sleeps.
// - A park() returns within kParkTimeoutUs, so work that reached the progress thread by
//   no signal at all (a post after a short wait) still waits at most that long.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/status.h"

namespace afd::comm::ucx {

// A token naming the calling thread (a thread-local's address: cheaper than
// std::this_thread::get_id(), which is a call into libc).
inline thread_local char t_thread_token;
inline const void* this_thread_token() { return &t_thread_token; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class WorkerLock {
 public:
  // Longest a park() sleeps without a wake.
  static constexpr int kParkTimeoutUs = 250;

  // queued: how much work is queued for the next holder (the transport's command count,
  // changed with seq_cst or release stores); stop: set once when the transport closes.
  // Both outlive this object.
  WorkerLock(const std::atomic<int>& queued, const std::atomic<bool>& stop) : queued_(queued), stop_(stop) {}
  ~WorkerLock();
  WorkerLock(const WorkerLock&) = delete;
  WorkerLock& operator=(const WorkerLock&) = delete;

  // Creates the wake fd (an eventfd). io_error if it cannot.
  Status init();
  int wake_fd() const { return wake_fd_; }

  // ---- holder ----
  bool try_lock() {
    if (locked_.load(std::memory_order_relaxed) || locked_.exchange(true, std::memory_order_acquire)) return false;
    owner_.store(this_thread_token(), std::memory_order_relaxed);
    return true;
  }
  void lock();
  void unlock() {
    owner_.store(nullptr, std::memory_order_relaxed);
    locked_.store(false, std::memory_order_release);
  }
  bool held_by_me() const { return owner_.load(std::memory_order_relaxed) == this_thread_token(); }
  bool locked() const { return locked_.load(std::memory_order_relaxed); }
  // Some thread waits in lock().
  bool wanted() const { return wanted_.load(std::memory_order_relaxed) > 0; }

  class Guard {
   public:
    explicit Guard(WorkerLock& l) : l_(l), mine_(!l.held_by_me()) {
      if (mine_) l_.lock();
    }
    ~Guard() {
      if (mine_) l_.unlock();
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    WorkerLock& l_;
    bool mine_;
  };

  // ---- waiter ----
  // Lock held: this waiter took the worker (keeps a parked progress thread parked a period).
  void note_drive() { epoch_.store(epoch_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  void join() { waiters_.fetch_add(1, std::memory_order_seq_cst); }
  // True when no joined waiter remains: `joined` says whether this one had joined (one
  // that had not counts as the last).
  bool leave(bool joined) { return !joined || waiters_.fetch_sub(1, std::memory_order_seq_cst) == 1; }
  // Lock not held: the progress thread runs instead of parking, woken if it sleeps.
  void hand_off() {
    handoff_.store(true, std::memory_order_seq_cst);  // before wake() reads sleeping_ (park_until)
    wake();
  }

  // ---- poster ----
  void request_handoff() { handoff_.store(true, std::memory_order_relaxed); }

  // ---- progress thread ----
  // Whether to park rather than drive the worker: false (and the request cleared) after a
  // hand-off; true while a waiter is joined; false with work queued; true once after a
  // note_drive() since the last look; false otherwise.
  bool should_park();
  // Sleeps up to kParkTimeoutUs on wake_fd(), unless a hand-off is raised or work is
  // queued with no joined waiter.
  void park();
  // The worker is held by another thread: raises the hand-off (for the next look) and
  // sleeps up to kParkTimeoutUs while it stays held.
  void park_behind_holder();
  // Around the progress thread's own blocking wait: wake() writes wake_fd() meanwhile.
  void begin_sleep() { sleeping_.store(true, std::memory_order_seq_cst); }
  void end_sleep() { sleeping_.store(false, std::memory_order_seq_cst); }
  // Consumes a wake-up written to wake_fd().
  void drain_wake_fd();

  // ---- anyone ----
  // Wakes the progress thread if it sleeps (after queueing work for it).
  void wake() {
    if (sleeping_.load(std::memory_order_seq_cst)) write_wake_fd();
  }
  // Wakes the progress thread whether or not it sleeps (closing).
  void wake_always() { write_wake_fd(); }

 private:
  void park_until(bool behind_holder);
  void write_wake_fd();

  const std::atomic<int>& queued_;
  const std::atomic<bool>& stop_;
  int wake_fd_ = -1;

  // A test-and-test-and-set flag, not a std::mutex: unlock is a plain release store, and
  // nobody sleeps on it (try_lock fails at once; lock backs off), which suits holders that
  // keep it for one pass of work at a time.
  std::atomic<bool> locked_{false};
  std::atomic<const void*> owner_{nullptr};  // this_thread_token() of the holder
  std::atomic<int> wanted_{0};               // threads in lock()

  std::atomic<int> waiters_{0};        // joined waiters
  std::atomic<uint64_t> epoch_{0};     // note_drive() count (written by holders only)
  std::atomic<bool> handoff_{false};   // the progress thread is to run at its next look
  std::atomic<bool> sleeping_{false};  // the progress thread is in park() or begin/end_sleep
  uint64_t seen_epoch_ = 0;            // progress thread only
};

}  // namespace afd::comm::ucx
