#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

namespace afd {
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
}  // namespace afd
