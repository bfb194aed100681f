#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#if defined(__x86_64__)
#include <immintrin.h>
#define AFD_PAUSE() _mm_pause()
#else
#define AFD_PAUSE() std::this_thread::yield()
#endif

namespace afd {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  wake_.fetch_add(1);
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::work(uint64_t gen, int thread) {
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    const uint64_t g = s >> 48, n = (s >> 24) & 0xffffffu, next = s & 0xffffffu;
    if (g != (gen & 0xffffu) || next >= n) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
    // Claimed task `next` of this region: the caller cannot leave run() before we finish,
    // so fn_ stays valid.
    try {
      (*fn_)(static_cast<int>(next), thread);
    } catch (...) {
      if (!has_error_.exchange(true)) error_ = std::current_exception();
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_loop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    // Spin ~100us for the next region, then sleep.
    auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
    uint64_t w = wake_.load(std::memory_order_acquire);
    while (w == seen) {
      for (int i = 0; i < 64 && w == seen; ++i) {
        AFD_PAUSE();
        w = wake_.load(std::memory_order_acquire);
      }
      if (w == seen && std::chrono::steady_clock::now() > spin_until) {
        wake_.wait(seen, std::memory_order_acquire);
        w = wake_.load(std::memory_order_acquire);
      }
    }
    seen = w;
    if (stop_.load()) return;
    // The region to help is whatever state_ names now; work() refuses a stale one.
    work(state_.load(std::memory_order_acquire) >> 48, thread);
  }
}

void ThreadPool::run(int n_tasks, const std::function<void(int, int)>& fn) {
  if (n_tasks <= 0) return;
  bool expected = false;
  if (n_threads_ == 1 || n_tasks == 1 || n_tasks >= (1 << 24) ||
      !in_region_.compare_exchange_strong(expected, true)) {
    for (int t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  fn_ = &fn;
  has_error_.store(false);
  error_ = nullptr;
  done_.store(0, std::memory_order_relaxed);
  gen_ = (gen_ + 1) & 0xffffu;
  state_.store(pack(gen_, static_cast<uint64_t>(n_tasks), 0), std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_acq_rel);
  wake_.notify_all();
  work(gen_, 0);
  while (done_.load(std::memory_order_acquire) != n_tasks) AFD_PAUSE();
  fn_ = nullptr;
  in_region_.store(false);
  if (has_error_.load()) std::rethrow_exception(error_);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t align) {
  if (n <= 0) return;
  int parts = n_threads_;
  int64_t chunk = (n + parts - 1) / parts;
  if (align > 1) chunk = (chunk + align - 1) / align * align;
  int n_chunks = static_cast<int>((n + chunk - 1) / chunk);
  run(n_chunks, [&](int task, int thread) {
    int64_t b = task * chunk, e = std::min(n, b + chunk);
    fn(b, e, thread);
  });
}

}  // namespace afd
