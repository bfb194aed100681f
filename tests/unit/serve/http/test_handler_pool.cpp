// HandlerPool: bounded threads, started on demand, given back when idle.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "serve/http/handler_pool.h"

namespace afd::serve::http::test_handler_pool {
namespace {

TEST(HandlerPool, NeverMoreThreadsThanItsLimitAndEveryTaskRuns) {
  HandlerPool pool(3, /*idle_exit_s=*/60);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> running{0}, peak{0}, done{0};
  for (int i = 0; i < 10; ++i)
    pool.submit([&] {
      const int now = running.fetch_add(1) + 1;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {
      }
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return release; });
      running.fetch_sub(1);
      done.fetch_add(1);
    });
  for (int i = 0; i < 2000 && running.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(pool.threads(), 3);
  EXPECT_EQ(pool.queued(), 7u);
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  pool.shutdown();
  EXPECT_EQ(done.load(), 10);
  EXPECT_EQ(peak.load(), 3);
  EXPECT_EQ(pool.threads(), 0);
}

TEST(HandlerPool, IdleThreadsAreGivenBack) {
  HandlerPool pool(8, /*idle_exit_s=*/0.05);
  std::atomic<int> done{0};
  for (int i = 0; i < 8; ++i)
    pool.submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done.fetch_add(1);
    });
  for (int i = 0; i < 2000 && (done.load() < 8 || pool.threads() > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(done.load(), 8);
  EXPECT_EQ(pool.threads(), 0);
  // And it starts threads again when work comes.
  pool.submit([&] { done.fetch_add(1); });
  pool.shutdown();
  EXPECT_EQ(done.load(), 9);
}

}  // namespace
}  // namespace afd::serve::http::test_handler_pool
