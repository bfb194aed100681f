// ThreadPool: a fixed set of workers for kernel-level parallelism.
// Contract: one parallel region at a time per pool (run() is not reentrant); a run()
// issued while a region is active (from a task, or from another thread) executes inline
// on the calling thread. The caller participates as thread 0 and returns as soon as every
// task has finished — it never waits for workers that have not woken up: tasks are
// claimed with a compare-and-swap on a word tagged with the region's generation, so a
// late worker cannot take a task of a region that has already ended. Workers spin briefly
// between regions (decode steps issue thousands of small regions per second), then sleep.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace afd {

class ThreadPool {
 public:
  // n_threads: total threads including the caller; <= 0 means hardware concurrency.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(task, thread) for every task in [0, n_tasks); tasks are handed out
  // dynamically. Returns when all are done. Exceptions from fn are rethrown here (first one).
  // n_tasks must be < 2^24.
  void run(int n_tasks, const std::function<void(int task, int thread)>& fn);

  // Splits [0, n) into size() contiguous chunks (aligned to `align`) and calls fn(begin, end, thread).
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end, int thread)>& fn,
                    int64_t align = 1);

 private:
  // state_: generation (16 bits) | n_tasks (24 bits) | next task (24 bits).
  static uint64_t pack(uint64_t gen, uint64_t n, uint64_t next) {
    return ((gen & 0xffffu) << 48) | ((n & 0xffffffu) << 24) | (next & 0xffffffu);
  }
  void worker_loop(int thread);
  // Claims and runs tasks of region `gen` until none is left.
  void work(uint64_t gen, int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> wake_{0};   // bumped per region (and at shutdown): workers wait on it
  std::atomic<uint64_t> state_{0};  // see pack()
  std::atomic<int> done_{0};        // tasks finished in the current region
  std::atomic<bool> stop_{false};
  std::atomic<bool> in_region_{false};
  uint64_t gen_ = 0;                // current region's generation (caller side)
  const std::function<void(int, int)>* fn_ = nullptr;  // valid while a claimed task is unfinished
  std::exception_ptr error_;
  std::atomic<bool> has_error_{false};
};

}  // namespace afd
