// HandlerPool: the threads HTTP handlers run on, at most `max_threads` of them. Threads are
// started when work arrives and no thread is free, and end after `idle_exit_s` without work
// (down to none), so an idle server holds no handler threads and a burst's threads, the
// stack pages their handlers touched and (when the last one ends) the free heap memory
// are given back. Tasks wait in FIFO order while all
// threads are busy; the queue is bounded by whoever submits (the server: one task per
// connection).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace afd::serve::http {

class HandlerPool {
 public:
  explicit HandlerPool(int max_threads, double idle_exit_s = 60);
  ~HandlerPool();  // shutdown()
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Runs `task` on a pool thread. After shutdown() the task runs on the caller's thread.
  void submit(std::function<void()> task);
  // Runs every queued task and waits until every thread has ended. Idempotent.
  void shutdown();

  int threads() const;  // started and not yet ended
  int busy() const;     // running a task
  size_t queued() const;

 private:
  void worker();

  const int max_threads_;
  const double idle_exit_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int live_ = 0, idle_ = 0;  // threads started and not ended; of those, waiting for work
  bool shutdown_ = false;
};

}  // namespace afd::serve::http
