#include <gtest/gtest.h>

#include "serve/scheduling/router.h"

namespace afd::serve::test_router {
namespace {

TEST(Router, BalancesByTokenLoadNotRequestCount) {
  // Worker 0 holds one long sequence, worker 1 many short ones with fewer tokens in total.
  std::vector<int64_t> load = {4000, 900};
  Router r(2, [&](int w) { return load[w]; });
  std::vector<int32_t> p(100, 1);
  EXPECT_EQ(r.place(p), 1);
  load = {100, 900};
  std::vector<int32_t> q(100, 2);
  EXPECT_EQ(r.place(q), 0);
}

TEST(Router, SharedPrefixGoesWhereItWasPlaced) {
  std::vector<int64_t> load = {0, 0, 0};
  Router r(3, [&](int w) { return load[w]; }, /*prefix_block=*/16);
  std::vector<int32_t> system(64, 7);
  std::vector<int32_t> a = system, b = system;
  a.insert(a.end(), {1, 2, 3});
  b.insert(b.end(), {4, 5, 6});
  int wa = r.place(a);
  load[wa] = 40;  // somewhat busier, but the 64-token prefix outweighs it
  EXPECT_EQ(r.place(b), wa);
  load[wa] = 500;  // far busier: balance wins
  EXPECT_NE(r.place(b), wa);
}

TEST(Router, SkipsIneligibleWorkers) {
  std::vector<int64_t> load = {0, 100, 50};
  Router r(3, [&](int w) { return load[w]; }, 4);
  std::vector<int32_t> p = {1, 2, 3, 4, 5};
  EXPECT_EQ(r.place(p, {false, true, true}), 2);  // worker 0 is least loaded but not eligible
  EXPECT_EQ(r.place(p, {false, true, false}), 1);
  EXPECT_EQ(r.place(p, {false, false, false}), -1);
  EXPECT_EQ(r.place(p, {true, false, false}), 0);
  // The prefix placed on 2 above pulls the prompt there once 2 is eligible again and loads tie.
  load = {0, 0, 0};
  std::vector<int32_t> q = {9, 9, 9, 9, 9};
  EXPECT_EQ(r.place(q, {false, false, true}), 2);
  EXPECT_EQ(r.place(q, {true, true, true}), 2);
}

TEST(PrefixIndex, MatchesWholeBlocksOnly) {
  PrefixIndex idx(4, 100);
  std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(idx.match(t), 0);
  idx.insert(t);
  EXPECT_EQ(idx.match(t), 8);
  std::vector<int32_t> u = {1, 2, 3, 4, 5, 6, 0, 8};
  EXPECT_EQ(idx.match(u), 4);
  PrefixIndex small(1, 2);
  small.insert(std::vector<int32_t>{1, 2, 3});  // capacity 2: the first block hash is forgotten
  EXPECT_EQ(small.match(std::vector<int32_t>{1, 2, 3}), 0);
}

TEST(Router, GrowsForWorkersThatJoin) {
  std::vector<int64_t> load = {500, 500, 0};
  Router r(2, [&](int w) { return load[w]; }, 4);
  EXPECT_EQ(r.n_workers(), 2);
  std::vector<int32_t> p = {1, 2, 3, 4, 5};
  EXPECT_NE(r.place(p), 2);  // not a worker yet
  r.grow(3);
  EXPECT_EQ(r.n_workers(), 3);
  EXPECT_EQ(r.place(p), 2);  // the idle newcomer
  r.grow(1);                 // never shrinks
  EXPECT_EQ(r.n_workers(), 3);
  // An eligibility list longer than the router grows it first.
  load.push_back(0);
  load[2] = 900;
  EXPECT_EQ(r.place(p, {false, true, true, true}), 3);
  EXPECT_EQ(r.n_workers(), 4);
}

TEST(Router, ForgetEmptiesOneWorkersPrefixes) {
  std::vector<int64_t> load = {0, 0};
  Router r(2, [&](int w) { return load[w]; }, 16);
  std::vector<int32_t> a(64, 7);
  const int w = r.place(a);
  load[w] = 40;  // the 64-token prefix there outweighs this
  EXPECT_EQ(r.place(a), w);
  r.forget(w);  // that worker left (its slot may be taken again): its prefixes are not there
  EXPECT_NE(r.place(a), w);
  r.forget(7);  // no such worker: nothing
}

}  // namespace
}  // namespace afd::serve::test_router
