#include "serve/http/handler_pool.h"

#include <algorithm>
#include <chrono>

namespace afd::serve::http {

HandlerPool::HandlerPool(int max_threads, double idle_exit_s)
    : max_threads_(std::max(1, max_threads)), idle_exit_s_(idle_exit_s) {}

HandlerPool::~HandlerPool() { shutdown(); }

void HandlerPool::reap_locked(std::vector<std::thread>* out) {
  for (std::thread::id id : ended_) {
    auto it = std::find_if(threads_.begin(), threads_.end(), [id](const std::thread& t) { return t.get_id() == id; });
    if (it == threads_.end()) continue;
    out->push_back(std::move(*it));
    threads_.erase(it);
  }
  ended_.clear();
}

void HandlerPool::submit(std::function<void()> task) {
  std::vector<std::thread> done;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (shutdown_) {
      l.unlock();
      task();
      return;
    }
    reap_locked(&done);
    queue_.push_back(std::move(task));
    if (idle_ >= static_cast<int>(queue_.size())) {
      cv_.notify_one();
    } else if (live_ < max_threads_) {
      ++live_;
      threads_.emplace_back([this] { worker(); });
    }
  }
  for (std::thread& t : done) t.join();  // they have left worker(): joins at once
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
  --live_;
  ended_.push_back(std::this_thread::get_id());
  cv_.notify_all();
}

void HandlerPool::shutdown() {
  std::vector<std::thread> all;
  {
    std::unique_lock<std::mutex> l(mu_);
    shutdown_ = true;
    cv_.notify_all();
    // Queued tasks still run (on the pool's threads) before the threads end.
    cv_.wait(l, [this] { return live_ == 0; });
    for (std::thread& t : threads_) all.push_back(std::move(t));
    threads_.clear();
    ended_.clear();
  }
  for (std::thread& t : all)
    if (t.joinable()) t.join();
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
