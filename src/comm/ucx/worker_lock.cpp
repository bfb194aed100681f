#include "comm/ucx/worker_lock.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace afd::comm::ucx {

WorkerLock::~WorkerLock() {
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status WorkerLock::init() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return io_error("ucx transport: eventfd creation failed");
  return Status();
}

void WorkerLock::lock() {
  if (try_lock()) return;
  wanted_.fetch_add(1, std::memory_order_relaxed);
  for (uint32_t n = 0; !try_lock(); ++n) {
    if (n < 64) {
      cpu_relax();
    } else if (n < 1024) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  wanted_.fetch_sub(1, std::memory_order_relaxed);
}

bool WorkerLock::should_park() {
  if (handoff_.load(std::memory_order_acquire)) {
    handoff_.store(false, std::memory_order_relaxed);
    return false;
  }
  if (waiters_.load(std::memory_order_seq_cst) > 0) return true;
  if (queued_.load(std::memory_order_acquire) > 0) return false;  // nobody joined to run it
  uint64_t e = epoch_.load(std::memory_order_relaxed);
  if (e == seen_epoch_) return false;
  seen_epoch_ = e;
  return true;
}

void WorkerLock::park() { park_until(/*behind_holder=*/false); }

void WorkerLock::park_behind_holder() {
  handoff_.store(true, std::memory_order_relaxed);
  park_until(/*behind_holder=*/true);
}

void WorkerLock::park_until(bool behind_holder) {
  // Dekker with hand_off() and with a queueing thread's wake(): each stores its flag (the
  // hand-off, the queued count) before it reads sleeping_, and this stores sleeping_
  // before it reads theirs, all seq_cst, so at least one of the two sees the other.
  // Behind a holder, the flag is the lock itself: a waiter unlocks before it hands off.
  sleeping_.store(true, std::memory_order_seq_cst);
  const bool sleep = behind_holder ? locked_.load(std::memory_order_seq_cst)
                                   : !handoff_.load(std::memory_order_seq_cst) &&
                                         (waiters_.load(std::memory_order_seq_cst) > 0 ||
                                          queued_.load(std::memory_order_seq_cst) == 0);
  if (sleep && !stop_.load()) {
    pollfd p{wake_fd_, POLLIN, 0};
    timespec ts{0, kParkTimeoutUs * 1000};
    if (::ppoll(&p, 1, &ts, nullptr) > 0) drain_wake_fd();
  }
  sleeping_.store(false, std::memory_order_seq_cst);
}

void WorkerLock::drain_wake_fd() {
  uint64_t v;
  ssize_t n = ::read(wake_fd_, &v, sizeof v);
  (void)n;
}

void WorkerLock::write_wake_fd() {
  uint64_t one = 1;
  ssize_t r = ::write(wake_fd_, &one, sizeof one);
  (void)r;
}

}  // namespace afd::comm::ucx
