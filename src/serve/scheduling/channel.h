// RequestChannel: hands a request's output from its scheduler thread (producer) to the
// HTTP handler thread (consumer), and the client's cancellation back. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "serve/api/stream_event.h"

namespace afd::serve {

class RequestChannel {
 public:
  void push(StreamEvent e) {
    {
      std::lock_guard<std::mutex> l(mu_);
      q_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  // Returns the queued events, waiting up to `timeout` for the first one.
  std::vector<StreamEvent> wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return !q_.empty(); });
    std::vector<StreamEvent> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
    q_.clear();
    return out;
  }
  // Best effort: the scheduler drops the request at its next step.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> q_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace afd::serve
