// AggregationPolicy (runtime/afd/aggregation_policy.h): the FFN worker's batching decisions,
// driven here without a transport or a clock. A Cluster holds the AggSlot records the
// worker would, and acts the worker's part: frames arrive (ready), batches are served,
// attention workers join or are dropped (rows emptied), times are given as numbers.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/afd/aggregation_policy.h"

namespace afd::test_aggregation_policy {
namespace {

constexpr uint32_t kLayers = 3;
constexpr int64_t kMs = 1000000;
constexpr int64_t kPeerTimeout = 100 * kMs;
constexpr int64_t kWindow = 2 * kMs;

using Peers = std::vector<size_t>;

// n attention workers with `mbs` micro-batches each; all served, idle, receiving.
struct Cluster {
  std::vector<std::vector<AggSlot>> slots;
  std::vector<bool> serving;
  AggregationPolicy policy{kLayers, kPeerTimeout, kWindow};

  Cluster(size_t n, int mbs) {
    for (size_t i = 0; i < n; ++i) add(mbs);
  }
  size_t add(int mbs) {  // a new attention worker's accepted handshake
    slots.emplace_back(static_cast<size_t>(mbs));
    for (AggSlot& s : slots.back()) s.receiving = true;
    serving.push_back(true);
    return slots.size() - 1;
  }
  void drop(size_t p) {  // lost: no longer served
    serving[p] = false;
    for (AggSlot& s : slots[p]) {
      s.ready = s.receiving = false;
      AggregationPolicy::reset(s);
    }
  }
  AggGrid grid() {
    AggGrid g(slots.size());
    for (size_t p = 0; p < slots.size(); ++p) {
      if (!serving[p]) continue;
      for (AggSlot& s : slots[p]) g[p].push_back(&s);
    }
    return g;
  }
  void arrive(size_t p, int mb, uint32_t layer) {
    AggSlot& s = slots[p][static_cast<size_t>(mb)];
    s.ready = true;
    s.layer = layer;
  }
  // What the worker does with a batch's members: consumes the frames, re-posts the
  // receives, replies (served).
  Peers serve(const BatchKey& k) {
    Peers m = policy.members(grid(), k);
    for (size_t p : m) {
      AggSlot& s = slots[p][static_cast<size_t>(k.mb)];
      s.ready = false;
      s.receiving = true;
      policy.served(s, k.layer);
    }
    return m;
  }
  // Every attention worker in `who` runs one full step on micro-batch mb, in lockstep: each
  // layer's batch has them all, with no wait.
  void lockstep(const Peers& who, int mb) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (size_t p : who) arrive(p, mb, l);
      auto k = policy.next_batch(grid(), 0);
      ASSERT_TRUE(k.has_value());
      EXPECT_EQ(k->layer, l);
      EXPECT_TRUE(policy.waiting_for(grid(), *k).empty()) << "layer " << l;
      EXPECT_EQ(serve(*k), who) << "layer " << l;
    }
  }
};

TEST(AggregationPolicy, NothingReadyNoBatch) {
  Cluster c(2, 2);
  EXPECT_FALSE(c.policy.next_batch(c.grid(), 0).has_value());
}

TEST(AggregationPolicy, LowestLayerFirstTiesRotate) {
  Cluster c(3, 2);
  c.arrive(0, 0, 2);
  c.arrive(1, 1, 1);
  c.arrive(2, 0, 1);
  auto k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->layer, 1u);
  EXPECT_EQ(k->peer, 1u);
  EXPECT_EQ(k->mb, 1);
  k = c.policy.next_batch(c.grid(), 2);  // the scan starts at worker 2: it wins the tie
  ASSERT_TRUE(k);
  EXPECT_EQ(k->peer, 2u);
  EXPECT_EQ(k->mb, 0);
}

// All active attention workers send every layer: each batch aggregates all of them, waits
// for nobody, and after the step they are idle and expected at the next step's layer 0.
TEST(AggregationPolicy, AllActiveWorkersPresent) {
  Cluster c(3, 2);
  c.lockstep({0, 1, 2}, 0);
  for (size_t p = 0; p < 3; ++p) {
    EXPECT_EQ(c.slots[p][0].expect_layer, -1);
    EXPECT_TRUE(c.slots[p][0].active_last_step);
    EXPECT_FALSE(c.slots[p][1].active_last_step);  // micro-batch 1 did not run
  }
  // Next step: worker 0 is first at layer 0; the others, active last step, are waited for
  // within the gather window, and all three aggregate.
  c.arrive(0, 0, 0);
  auto k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.policy.waiting_for(c.grid(), *k), (Peers{1, 2}));
  EXPECT_EQ(c.policy.gather_deadline(0, 50 * kMs), 50 * kMs + kWindow);
  c.arrive(1, 0, 0);
  c.arrive(2, 0, 0);
  EXPECT_TRUE(c.policy.waiting_for(c.grid(), *k).empty());
  auto end = c.policy.end_gather(c.grid(), *k);
  EXPECT_TRUE(end.late.empty());
  EXPECT_TRUE(end.skipped.empty());
  EXPECT_EQ(c.serve(*k), (Peers{0, 1, 2}));
}

// A worker that was not active in its last step on a micro-batch is not waited for at
// layer 0; one that was, but does not come within the gather window, is waited for once
// and then not again until it finishes a step there.
TEST(AggregationPolicy, InactiveLastStepNotWaitedPastGatherWindow) {
  Cluster c(2, 1);
  c.lockstep({0, 1}, 0);
  // Step 2: only worker 0 runs. Worker 1 was active: waited for, for the window only.
  const int64_t t0 = 10 * kMs;
  c.arrive(0, 0, 0);
  auto k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  const Peers waiting = c.policy.waiting_for(c.grid(), *k);
  EXPECT_EQ(waiting, (Peers{1}));
  const int64_t dl = c.policy.gather_deadline(k->layer, t0);
  EXPECT_TRUE(AggregationPolicy::keep_waiting(waiting, dl, t0 + kWindow - 1));
  EXPECT_FALSE(AggregationPolicy::keep_waiting(waiting, dl, t0 + kWindow));
  auto end = c.policy.end_gather(c.grid(), *k);
  EXPECT_TRUE(end.late.empty());
  EXPECT_EQ(end.skipped, (Peers{1}));
  EXPECT_FALSE(c.slots[1][0].active_last_step);
  EXPECT_EQ(c.slots[1][0].expect_layer, -1);
  EXPECT_EQ(c.serve(*k), (Peers{0}));
  // Its layers 1 and 2 do not wait for worker 1 (it is idle, not mid-step).
  for (uint32_t l = 1; l < kLayers; ++l) {
    c.arrive(0, 0, l);
    k = c.policy.next_batch(c.grid(), 0);
    ASSERT_TRUE(k);
    EXPECT_TRUE(c.policy.waiting_for(c.grid(), *k).empty());
    EXPECT_EQ(c.serve(*k), (Peers{0}));
  }
  // Step 3: worker 1 is no longer waited for at layer 0.
  c.arrive(0, 0, 0);
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_TRUE(c.policy.waiting_for(c.grid(), *k).empty());
  EXPECT_TRUE(c.policy.end_gather(c.grid(), *k).skipped.empty());
}

// A worker mid-step (expected at layer 2) that sends nothing: the batch waits for it up to
// the peer timeout, then it is late — no longer expected, so the next steps do not wait for
// it mid-step — and its frame, when it comes, is served on its own.
TEST(AggregationPolicy, MidStepStragglerHitsPeerTimeout) {
  Cluster c(2, 1);
  for (uint32_t l = 0; l < 2; ++l) {
    c.arrive(0, 0, l);
    c.arrive(1, 0, l);
    auto k = c.policy.next_batch(c.grid(), 0);
    ASSERT_TRUE(k);
    EXPECT_EQ(c.serve(*k), (Peers{0, 1}));
  }
  EXPECT_EQ(c.slots[1][0].expect_layer, 2);
  c.arrive(0, 0, 2);
  auto k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  const Peers waiting = c.policy.waiting_for(c.grid(), *k);
  EXPECT_EQ(waiting, (Peers{1}));
  const int64_t t0 = 7 * kMs, dl = c.policy.gather_deadline(2, t0);
  EXPECT_EQ(dl, t0 + kPeerTimeout);
  EXPECT_TRUE(AggregationPolicy::keep_waiting(waiting, dl, t0 + kWindow * 10));  // not the layer-0 window
  EXPECT_FALSE(AggregationPolicy::keep_waiting(waiting, dl, dl));
  auto end = c.policy.end_gather(c.grid(), *k);
  EXPECT_EQ(end.late, (Peers{1}));
  EXPECT_TRUE(end.skipped.empty());
  EXPECT_EQ(c.slots[1][0].expect_layer, -1);
  EXPECT_EQ(c.serve(*k), (Peers{0}));
  // The late frame comes: served alone, waiting for nobody.
  c.arrive(1, 0, 2);
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->peer, 1u);
  EXPECT_TRUE(c.policy.waiting_for(c.grid(), *k).empty());
  EXPECT_EQ(c.serve(*k), (Peers{1}));
}

// A worker behind the chosen batch (expects a lower layer on that micro-batch) is caught up
// first: the batch waits for it (catch-up, peer timeout), its lower layer is then chosen;
// one that never comes is late after the timeout.
TEST(AggregationPolicy, CatchUpWaitsForWorkerBehind) {
  Cluster c(2, 1);
  c.slots[0][0].expect_layer = 2;
  c.slots[1][0].expect_layer = 1;
  c.arrive(0, 0, 2);
  auto k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->layer, 2u);
  EXPECT_EQ(c.policy.behind(c.grid(), *k), (Peers{1}));
  EXPECT_EQ(c.policy.catch_up_deadline(5), 5 + kPeerTimeout);
  c.arrive(1, 0, 1);
  EXPECT_TRUE(c.policy.behind(c.grid(), *k).empty());
  EXPECT_TRUE(c.policy.give_up_behind(c.grid(), *k).empty());
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->layer, 1u);
  EXPECT_EQ(k->peer, 1u);
  EXPECT_EQ(c.serve(*k), (Peers{1}));
  // Now both are at layer 2: one batch.
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.policy.waiting_for(c.grid(), *k), (Peers{1}));
  c.arrive(1, 0, 2);
  EXPECT_EQ(c.serve(*k), (Peers{0, 1}));

  // A worker behind that never sends: late after the catch-up wait.
  Cluster d(2, 1);
  d.slots[1][0].expect_layer = 1;
  d.arrive(0, 0, 2);
  k = d.policy.next_batch(d.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(d.policy.give_up_behind(d.grid(), *k), (Peers{1}));
  EXPECT_EQ(d.slots[1][0].expect_layer, -1);
  EXPECT_TRUE(d.policy.behind(d.grid(), *k).empty());
}

// A worker that joins mid-run (handshake accepted while the others are mid-step) is not
// waited for until it has finished a step; then it is, like the others.
TEST(AggregationPolicy, WorkerJoinsMidRun) {
  Cluster c(2, 1);
  c.lockstep({0, 1}, 0);
  c.arrive(0, 0, 0);
  c.arrive(1, 0, 0);
  auto k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.serve(*k), (Peers{0, 1}));
  const size_t joined = c.add(1);  // joins while 0 and 1 are at layer 1
  for (uint32_t l = 1; l < kLayers; ++l) {
    c.arrive(0, 0, l);
    c.arrive(1, 0, l);
    k = c.policy.next_batch(c.grid(), 0);
    ASSERT_TRUE(k);
    EXPECT_TRUE(c.policy.waiting_for(c.grid(), *k).empty()) << "layer " << l;
    EXPECT_EQ(c.serve(*k), (Peers{0, 1}));
  }
  // Its first step: at layer 0 it arrives with the others (nobody waits for it, as it was
  // not active), and from layer 1 on it is expected like them.
  c.arrive(0, 0, 0);
  c.arrive(1, 0, 0);
  c.arrive(joined, 0, 0);
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.serve(*k), (Peers{0, 1, joined}));
  c.arrive(0, 0, 1);
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.policy.waiting_for(c.grid(), *k), (Peers{1, joined}));
  c.arrive(1, 0, 1);
  c.arrive(joined, 0, 1);
  EXPECT_EQ(c.serve(*k), (Peers{0, 1, joined}));
}

// A worker removed (lost, or dropped) mid-step: the others' batches neither wait for it nor
// include it, at any layer or at the next layer 0.
TEST(AggregationPolicy, WorkerRemoved) {
  Cluster c(3, 1);
  c.lockstep({0, 1, 2}, 0);
  c.arrive(0, 0, 0);
  c.arrive(1, 0, 0);
  c.arrive(2, 0, 0);
  auto k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.serve(*k), (Peers{0, 1, 2}));
  c.arrive(2, 0, 1);
  c.drop(2);  // its frame for layer 1 had arrived: dropped with it
  c.arrive(0, 0, 1);
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.policy.waiting_for(c.grid(), *k), (Peers{1}));
  c.arrive(1, 0, 1);
  EXPECT_EQ(c.serve(*k), (Peers{0, 1}));
  c.arrive(0, 0, 2);
  c.arrive(1, 0, 2);
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.serve(*k), (Peers{0, 1}));
  c.arrive(0, 0, 0);
  k = c.policy.next_batch(c.grid(), 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(c.policy.waiting_for(c.grid(), *k), (Peers{1}));
  EXPECT_TRUE(c.policy.end_gather(c.grid(), *k).late.empty());
}

}  // namespace
}  // namespace afd::test_aggregation_policy
