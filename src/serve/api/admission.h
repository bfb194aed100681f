// AdmissionLane: where a request's body is parsed, templated and tokenized before it reaches
// a scheduler or a worker.
//
// Work proportional to a body's size must not take CPU from decoding: a client sending
// large worst-case bodies (each under every limit) would otherwise cut everyone's decode
// throughput. Bodies of at most `inline_max_bytes` (every ordinary request) are admitted on
// the caller's handler thread at normal priority; larger ones go to `threads` background
// threads that run at the lowest CPU priority the OS grants without privileges (Linux
// SCHED_IDLE; else nice 19), so they use only CPU the engine leaves idle. At most
// `max_waiting` large bodies wait or run at once; one more is refused (run() returns nullopt:
// the server answers 503 + Retry-After).
// Thread-safe; run() blocks the caller until its task has run.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace afd::serve {

struct AdmissionOptions {
  size_t inline_max_bytes = 64 << 10;
  int threads = 0;        // background threads; 0: the number of CPUs
  int max_waiting = 64;   // large bodies queued or running at once
};

class AdmissionLane {
 public:
  explicit AdmissionLane(AdmissionOptions opt = {});
  ~AdmissionLane();
  AdmissionLane(const AdmissionLane&) = delete;
  AdmissionLane& operator=(const AdmissionLane&) = delete;

  // f() on this thread when body_bytes <= inline_max_bytes, else on a background thread
  // (this thread waits); nullopt when that lane is full.
  template <class F>
  std::optional<std::invoke_result_t<F>> run(size_t body_bytes, F&& f) {
    if (body_bytes <= opt_.inline_max_bytes) return f();
    std::optional<std::invoke_result_t<F>> out;
    if (!run_background([&] { out.emplace(f()); })) return std::nullopt;
    return out;
  }

  // Whether background threads got SCHED_IDLE (false: nice 19, or neither was granted).
  bool idle_priority() const { return idle_priority_; }
  // Large bodies refused because the lane was full, since creation.
  int64_t refused() const;

 private:
  struct Task;
  // Runs `task` on a background thread and waits for it; false (task not run) when full.
  bool run_background(const std::function<void()>& task);
  void worker();

  const AdmissionOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task*> queue_;
  int waiting_ = 0;  // queued or running
  int64_t refused_ = 0;
  bool stop_ = false;
  bool idle_priority_ = true;
  std::vector<std::thread> threads_;
};

}  // namespace afd::serve
