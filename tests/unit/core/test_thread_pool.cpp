#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

namespace afd::test_thread_pool {
namespace {

TEST(ThreadPool, RunsEveryTaskOnce) {
  ThreadPool pool(4);
  for (int rep = 0; rep < 200; ++rep) {
    std::vector<std::atomic<int>> hits(37);
    pool.run(37, [&](int t, int) { hits[t].fetch_add(1); });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, ParallelForCoversRange) {
  ThreadPool pool(3);
  std::vector<int> v(1001, 0);
  pool.parallel_for(1001, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) v[i] += 1;
  }, 16);
  for (int x : v) ASSERT_EQ(x, 1);
}

TEST(ThreadPool, NestedRunIsInline) {
  ThreadPool pool(2);
  std::atomic<int> n{0};
  pool.run(4, [&](int, int) { pool.run(3, [&](int, int) { n.fetch_add(1); }); });
  EXPECT_EQ(n.load(), 12);
}

TEST(ThreadPool, RethrowsTaskException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.run(8, [&](int t, int) { if (t == 5) throw std::runtime_error("x"); }), std::runtime_error);
  std::atomic<int> n{0};
  pool.run(8, [&](int, int) { n++; });  // still usable
  EXPECT_EQ(n.load(), 8);
}

}  // namespace
}  // namespace afd::test_thread_pool

namespace afd::test_thread_pool {
namespace {

// Many back-to-back small regions: every task of every region runs exactly once, even
// when workers wake late (the caller does not wait for them) — a stale worker must never
// run a task of a region that already ended.
TEST(ThreadPool, BackToBackRegionsRunEachTaskOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(5);
  for (int rep = 0; rep < 20000; ++rep) {
    for (auto& h : hits) h.store(0);
    const int n = 2 + rep % 4;
    pool.run(n, [&](int t, int) { hits[t].fetch_add(1); });
    for (int t = 0; t < n; ++t) ASSERT_EQ(hits[t].load(), 1) << "rep " << rep;
    for (int t = n; t < 5; ++t) ASSERT_EQ(hits[t].load(), 0) << "rep " << rep;
  }
}

// Two threads sharing one pool: the second caller runs inline while a region is active.
TEST(ThreadPool, ConcurrentCallersAreSafe) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  auto body = [&] {
    for (int i = 0; i < 2000; ++i) pool.run(3, [&](int, int) { total.fetch_add(1); });
  };
  std::thread a(body), b(body);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 2000 * 3);
}

}  // namespace
}  // namespace afd::test_thread_pool
