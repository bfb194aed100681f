#include "serve/api/admission.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <exception>

namespace afd::serve {

struct AdmissionLane::Task {
  const std::function<void()>* fn = nullptr;
  std::exception_ptr error;  // what fn threw, rethrown on the caller's thread
  bool done = false;
  std::condition_variable cv;
};

namespace {

// Lowers the calling thread's CPU priority as far as an unprivileged thread may; returns
// whether it got SCHED_IDLE. (Raising it back needs privileges, hence dedicated threads.)
bool lower_this_thread() {
#ifdef SCHED_IDLE
  sched_param p{};
  if (sched_setscheduler(0, SCHED_IDLE, &p) == 0) return true;
#endif
  (void)setpriority(PRIO_PROCESS, 0, 19);  // Linux: 0 is the calling thread
  return false;
}

}  // namespace

AdmissionLane::AdmissionLane(AdmissionOptions opt) : opt_(opt) {
  int n = opt_.threads;
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::mutex m;
  std::condition_variable started;
  int ready = 0;
  bool all_idle = true;
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([&, this] {
      const bool idle = lower_this_thread();
      {
        std::lock_guard<std::mutex> l(m);
        all_idle = all_idle && idle;
        ++ready;
      }
      started.notify_one();
      worker();
    });
  }
  std::unique_lock<std::mutex> l(m);
  started.wait(l, [&] { return ready == n; });
  idle_priority_ = all_idle;
}

AdmissionLane::~AdmissionLane() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

int64_t AdmissionLane::refused() const {
  std::lock_guard<std::mutex> l(mu_);
  return refused_;
}

bool AdmissionLane::run_background(const std::function<void()>& fn) {
  Task t;
  t.fn = &fn;
  std::unique_lock<std::mutex> l(mu_);
  if (stop_ || waiting_ >= opt_.max_waiting) {
    ++refused_;
    return false;
  }
  ++waiting_;
  queue_.push_back(&t);
  cv_.notify_one();
  t.cv.wait(l, [&] { return t.done; });
  --waiting_;
  l.unlock();
  if (t.error) std::rethrow_exception(t.error);
  return true;
}

void AdmissionLane::worker() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    Task* t = queue_.front();
    queue_.pop_front();
    l.unlock();
    try {
      (*t->fn)();
    } catch (...) {
      t->error = std::current_exception();
    }
    l.lock();
    t->done = true;
    t->cv.notify_one();
  }
}

}  // namespace afd::serve
