#include "serve/http/handler_pool.h"

#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <system_error>
#include <thread>

namespace afd::serve::http {
namespace {

// Gives the kernel back the pages of this thread's stack below the current frame (and a
// margin for what the thread still runs before it ends): a handler that once went deep
// (JSON, templates) leaves them resident otherwise, also in the C library's cache of stacks
// for new threads.
void release_unused_stack() {
  pthread_attr_t a;
  if (pthread_getattr_np(pthread_self(), &a) != 0) return;
  void* base = nullptr;
  size_t size = 0;
  const int r = pthread_attr_getstack(&a, &base, &size);
  pthread_attr_destroy(&a);
  if (r != 0 || base == nullptr) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  volatile char here = 0;
  const uintptr_t sp = reinterpret_cast<uintptr_t>(&here);
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(base) + page - 1) & ~(page - 1);
  const uintptr_t margin = 64 << 10;
  if (sp < lo + margin + page) return;
  const uintptr_t hi = (sp - margin) & ~(page - 1);
  (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

}  // namespace

HandlerPool::HandlerPool(int max_threads, double idle_exit_s)
    : max_threads_(std::max(1, max_threads)), idle_exit_s_(idle_exit_s) {}

HandlerPool::~HandlerPool() { shutdown(); }

void HandlerPool::submit(std::function<void()> task) {
  std::unique_lock<std::mutex> l(mu_);
  if (shutdown_) {
    l.unlock();
    task();
    return;
  }
  queue_.push_back(std::move(task));
  if (idle_ >= static_cast<int>(queue_.size())) {
    cv_.notify_one();
  } else if (live_ < max_threads_) {
    ++live_;
    // Detached: a thread that ends is gone, its stack released by the C library; shutdown()
    // waits for live_ to reach 0.
    try {
      std::thread([this] { worker(); }).detach();
    } catch (const std::system_error&) {
      // Out of threads: the task waits for a running thread, or for the next submit().
      --live_;
    }
  }
}

void HandlerPool::worker() {
  const auto idle_limit = std::chrono::duration<double>(idle_exit_s_);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (shutdown_) break;
      ++idle_;
      const bool woke = cv_.wait_for(l, idle_limit, [this] { return !queue_.empty() || shutdown_; });
      --idle_;
      if (!woke) break;  // idle for idle_exit_s: give the thread back
      continue;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    task();
    task = nullptr;  // what it captured is released before the thread waits again
    l.lock();
  }
  l.unlock();
  release_unused_stack();
  l.lock();
  --live_;
  const bool last = live_ == 0 && !shutdown_;
  cv_.notify_all();
  l.unlock();  // the last touch of the pool: shutdown() may destroy it once it sees live_ == 0
  // The last thread of a burst is gone: the heap memory its handlers freed goes back to the
  // kernel too, rather than staying with the allocator's per-thread arenas.
  if (last) malloc_trim(0);
}

void HandlerPool::shutdown() {
  std::unique_lock<std::mutex> l(mu_);
  shutdown_ = true;
  cv_.notify_all();
  // Queued tasks still run (on the pool's threads) before the threads end.
  cv_.wait(l, [this] { return live_ == 0; });
  // Tasks that never got a thread (thread creation failed) run here.
  while (!queue_.empty()) {
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    task();
    l.lock();
  }
}

int HandlerPool::threads() const {
  std::lock_guard<std::mutex> l(mu_);
  return live_;
}

int HandlerPool::busy() const {
  std::lock_guard<std::mutex> l(mu_);
  return live_ - idle_;
}

size_t HandlerPool::queued() const {
  std::lock_guard<std::mutex> l(mu_);
  return queue_.size();
}

}  // namespace afd::serve::http
