// ThreadPool: a fixed set of workers for kernel-level parallelism.
// Contract: one parallel region at a time per pool (run() is not reentrant); a run()
// issued from inside a region executes inline on the calling thread. The caller
// participates as thread 0. Workers spin briefly between regions (decode steps issue
// thousands of small regions per second) and then sleep on an atomic wait.
#pragma once

#include <atomic>
#include <cstdint>
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
  void run(int n_tasks, const std::function<void(int task, int thread)>& fn);

  // Splits [0, n) into size() contiguous chunks (aligned to `align`) and calls fn(begin, end, thread).
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end, int thread)>& fn,
                    int64_t align = 1);

 private:
  void worker_loop(int thread);
  void work(int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> next_task_{0};
  std::atomic<int> active_workers_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> in_region_{false};
  int n_tasks_ = 0;
  const std::function<void(int, int)>* fn_ = nullptr;
  std::exception_ptr error_;
  std::atomic<bool> has_error_{false};
};

}  // namespace afd
