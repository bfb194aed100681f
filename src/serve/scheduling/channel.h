// RequestChannel: hands a request's output from its scheduler thread (producer) to the
// HTTP handler thread (consumer), and the client's cancellation back. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/api/output.h"

namespace afd::serve {

struct TokenInfo {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // best first
};

// One step's output for one request. The last event has finish != none.
struct StreamEvent {
  std::string text;
  std::vector<TokenInfo> tokens;
  FinishReason finish = FinishReason::none;
  Status error;                  // finish == error
  int64_t prompt_tokens = 0;     // set on the last event
  int64_t completion_tokens = 0; // set on the last event
  uint64_t rng_draws = 0;        // the request's Sampler::draws() after these tokens
};

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
