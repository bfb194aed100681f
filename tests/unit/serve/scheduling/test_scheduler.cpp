#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../bytes_tokenizer.h"
#include "core/timer.h"
#include "../fake_engine.h"
#include "serve/scheduling/scheduler.h"
#include "serve/text/unicode.h"

namespace afd::serve::test_scheduler {
namespace {

using testing::FakeEngine;
constexpr int64_t kVocab = 257;

using testing::bytes_tokenizer;

struct Fixture {
  Fixture(int64_t blocks, int64_t block_size, SchedulerOptions o, int64_t max_seqs = 64)
      : engine(kVocab, 4096, blocks, block_size, max_seqs), metrics(1), sched(&engine, o, &metrics.worker(0), &metrics) {}
  std::shared_ptr<SeqRequest> submit(std::vector<int32_t> prompt, int64_t max_tokens, Status* st = nullptr) {
    GenerationRequest g;
    g.prompt = std::move(prompt);
    g.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    auto r = std::make_shared<SeqRequest>(g, tok.get(), std::vector<int32_t>{}, 0.0);
    Status s = sched.submit(r);
    if (st) *st = s;
    return r;
  }
  // Greedy continuation the fake engine implies.
  static std::vector<int32_t> expected(const std::vector<int32_t>& prompt, int64_t n) {
    std::vector<int32_t> out;
    int32_t last = prompt.back();
    int64_t len = static_cast<int64_t>(prompt.size());
    for (int64_t i = 0; i < n; ++i) {
      last = FakeEngine::next_token(last, len, kVocab);
      out.push_back(last);
      ++len;
    }
    return out;
  }
  std::shared_ptr<const Tokenizer> tok = bytes_tokenizer();
  FakeEngine engine;
  Metrics metrics;
  Scheduler sched;
};

struct Collected {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::none;
  Status error;
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
Collected drain(SeqRequest& r) {
  Collected c;
  for (StreamEvent& e : r.channel->wait(std::chrono::milliseconds(0))) {
    for (auto& t : e.tokens) c.tokens.push_back(t.token);
    if (e.finish != FinishReason::none) {
      c.finish = e.finish;
      c.error = e.error;
      c.prompt_tokens = e.prompt_tokens;
      c.completion_tokens = e.completion_tokens;
    }
  }
  return c;
}

void run_until_idle(Scheduler& s, int max_steps = 1000) {
  for (int i = 0; i < max_steps; ++i) {
    auto n = s.step();
    if (n.ok() && *n == 0 && s.n_waiting() == 0 && s.n_running() == 0) return;
  }
}

TEST(Scheduler, GreedyDecodeMatchesEngineAndReportsUsage) {
  Fixture f(1000, 4, {});
  auto r = f.submit({10, 20, 30}, 6);
  run_until_idle(f.sched);
  Collected c = drain(*r);
  EXPECT_EQ(c.tokens, Fixture::expected({10, 20, 30}, 6));
  EXPECT_EQ(c.finish, FinishReason::length);
  EXPECT_EQ(c.prompt_tokens, 3);
  EXPECT_EQ(c.completion_tokens, 6);
  EXPECT_EQ(f.engine.live_sequences(), 0);
  EXPECT_EQ(f.metrics.generation_tokens.load(), 6);
  EXPECT_EQ(f.metrics.ttft.count(), 1u);
}

TEST(Scheduler, FinishedSlotIsRefilledAtTheNextStep) {
  SchedulerOptions o;
  o.max_running = 2;
  Fixture f(1000, 4, o);
  auto a = f.submit({1}, 2);
  auto b = f.submit({2}, 6);
  auto c = f.submit({3}, 3);
  // Step 1: a and b prefill (1 token each) and sample their first token.
  ASSERT_TRUE(f.sched.step().ok());
  EXPECT_EQ(f.sched.n_running(), 2);
  EXPECT_EQ(f.sched.n_waiting(), 1);
  // Step 2: a samples its 2nd (last) token and leaves.
  ASSERT_TRUE(f.sched.step().ok());
  EXPECT_EQ(drain(*a).finish, FinishReason::length);
  EXPECT_EQ(f.sched.n_running(), 1);
  // Step 3: c is admitted into a's slot and runs in the same batch as b.
  auto n = f.sched.step();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2);
  EXPECT_EQ(f.sched.n_waiting(), 0);
  run_until_idle(f.sched);
  EXPECT_EQ(drain(*b).tokens.size(), 6u);
  EXPECT_EQ(f.engine.max_batch_seen, 2);
}

TEST(Scheduler, AdmissionWaitsForKvAndRejectsWhatCanNeverFit) {
  SchedulerOptions o;
  Fixture f(/*blocks=*/4, /*block=*/4, o);
  Status st;
  auto big = f.submit(std::vector<int32_t>(20, 5), 2, &st);  // needs 6 blocks > 4 total
  ASSERT_TRUE(st.is_ok());
  auto a = f.submit(std::vector<int32_t>(7, 5), 1);   // 2 blocks
  auto b = f.submit(std::vector<int32_t>(11, 5), 1);  // 3 blocks: must wait for a
  ASSERT_TRUE(f.sched.step().ok());
  Collected cb = drain(*big);
  EXPECT_EQ(cb.finish, FinishReason::error);
  EXPECT_EQ(cb.error.code(), StatusCode::resource_exhausted);
  EXPECT_EQ(f.sched.n_running(), 0);  // a ran one step and finished (max_tokens 1)
  EXPECT_EQ(drain(*a).finish, FinishReason::length);
  run_until_idle(f.sched);
  EXPECT_EQ(drain(*b).finish, FinishReason::length);
}

// Admission counts blocks as the engine's KV manager does (Engine::kv_blocks_needed), not as
// length / block size: with 2 blocks reserved per new sequence, 11 tokens (3 + 2 blocks) can
// never fit a 4-block cache and 3 tokens (1 + 2) can.
TEST(Scheduler, AdmissionAsksTheEngineHowManyBlocksASequenceTakes) {
  SchedulerOptions o;
  Fixture f(/*blocks=*/4, /*block=*/4, o);
  f.engine.new_sequence_extra_blocks = 2;
  auto big = f.submit(std::vector<int32_t>(11, 5), 1);
  auto small = f.submit(std::vector<int32_t>(3, 5), 1);
  run_until_idle(f.sched);
  Collected cb = drain(*big);
  EXPECT_EQ(cb.finish, FinishReason::error);
  EXPECT_EQ(cb.error.code(), StatusCode::resource_exhausted);
  EXPECT_NE(cb.error.message().find("needs 5 KV blocks"), std::string::npos) << cb.error.message();
  EXPECT_EQ(drain(*small).finish, FinishReason::length);
}

// Three sequences of 3 prompt tokens growing to 9 on a 6-block cache of 2-token blocks (5
// blocks each at the end): runs them to the end and checks every output is the unpreempted one.
void run_three_over_a_small_cache(Fixture& f) {
  std::vector<std::shared_ptr<SeqRequest>> rs;
  for (int i = 0; i < 3; ++i) rs.push_back(f.submit({static_cast<int32_t>(i + 1), 7, 9}, 6));
  run_until_idle(f.sched);
  for (int i = 0; i < 3; ++i) {
    Collected c = drain(*rs[i]);
    EXPECT_EQ(c.finish, FinishReason::length) << i;
    EXPECT_EQ(c.tokens, Fixture::expected({i + 1, 7, 9}, 6)) << i;
  }
  EXPECT_GT(f.metrics.worker(0).preemptions.load(), 0);
}

TEST(Scheduler, PreemptsByRecomputeWhenKvRunsOut) {
  SchedulerOptions o;
  Fixture f(/*blocks=*/6, /*block=*/2, o);
  run_three_over_a_small_cache(f);
  EXPECT_EQ(f.engine.live_sequences(), 0);
}

// One free block, three sequences that each need one at the same step: each fits alone, the
// batch does not; the scheduler preempts rather than failing the whole step.
TEST(Scheduler, BatchThatFitsOnlyItemByItemPreemptsInsteadOfFailing) {
  SchedulerOptions o;
  Fixture f(/*blocks=*/7, /*block=*/2, o);
  run_three_over_a_small_cache(f);
  EXPECT_EQ(f.engine.live_sequences(), 0);
}

// Two KV pools of 5 blocks (an engine over two attention engines): A and C share pool 0, B
// is alone in pool 1. When A and C reach 5 tokens each (3 blocks each) pool 0 is short while
// the sum of both pools still has room: the scheduler preempts within pool 0 instead of sending
// a batch whose forward pass would fail for every sequence in it.
TEST(Scheduler, KvFitsArePerPoolAndPreemptionFreesTheSamePool) {
  SchedulerOptions o;
  Fixture f(/*blocks=*/10, /*block=*/2, o);
  f.engine.n_pools = 2;
  auto a = f.submit({1, 7, 9}, 6);
  auto b = f.submit({2}, 1);
  auto c = f.submit({3, 7, 9}, 6);
  run_until_idle(f.sched);
  const std::vector<std::pair<std::shared_ptr<SeqRequest>, std::vector<int32_t>>> want = {
      {a, Fixture::expected({1, 7, 9}, 6)}, {b, Fixture::expected({2}, 1)}, {c, Fixture::expected({3, 7, 9}, 6)}};
  for (const auto& [r, tokens] : want) {
    Collected got = drain(*r);
    EXPECT_EQ(got.finish, FinishReason::length) << got.error.to_string();
    EXPECT_EQ(got.tokens, tokens);
  }
  EXPECT_GT(f.metrics.worker(0).preemptions.load(), 0);
  EXPECT_EQ(f.engine.live_sequences(), 0);
}

// Admission counts per pool too: with A's prompt in pool 0 (3 of its 4 blocks), C (2 blocks)
// placed in pool 0 as well waits for another placement instead of being admitted and then
// preempting A; the sum of the pools (8 blocks, 6 asked) would have let it in.
TEST(Scheduler, AdmissionWaitsWhenItsPoolIsShortEvenIfTheSumIsNot) {
  SchedulerOptions o;
  Fixture f(/*blocks=*/8, /*block=*/2, o);
  f.engine.n_pools = 2;
  auto a = f.submit({1, 7, 9, 4, 5}, 2);
  auto b = f.submit({2}, 1);
  auto c = f.submit({3, 7, 9}, 2);
  run_until_idle(f.sched);
  EXPECT_EQ(drain(*a).tokens, Fixture::expected({1, 7, 9, 4, 5}, 2));
  EXPECT_EQ(drain(*b).tokens, Fixture::expected({2}, 1));
  EXPECT_EQ(drain(*c).tokens, Fixture::expected({3, 7, 9}, 2));
  EXPECT_EQ(f.metrics.worker(0).preemptions.load(), 0);
  EXPECT_EQ(f.engine.live_sequences(), 0);
}

TEST(Scheduler, ChunkedPrefillRespectsTokenBudget) {
  SchedulerOptions o;
  o.max_batch_tokens = 4;
  Fixture f(1000, 4, o);
  std::vector<int32_t> prompt(10, 3);
  prompt.back() = 42;
  auto r = f.submit(prompt, 2);
  ASSERT_TRUE(f.sched.step().ok());
  ASSERT_TRUE(f.sched.step().ok());
  EXPECT_TRUE(drain(*r).tokens.empty());  // 8 of 10 prompt tokens done
  ASSERT_TRUE(f.sched.step().ok());
  EXPECT_EQ(drain(*r).tokens, Fixture::expected(prompt, 1));
  run_until_idle(f.sched);
}

// Prefix caching: the second request with the same 12-token prefix (3 blocks of 4) starts
// with those tokens' KV and forwards only the rest of its prompt.
TEST(Scheduler, SharedPrefixComputesFewerPromptTokens) {
  for (bool caching : {false, true}) {
    Fixture f(1000, 4, {});
    f.engine.prefix_caching = caching;
    std::vector<int32_t> prefix = {9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12, 13};
    std::vector<int32_t> pa = prefix, pb = prefix;
    pa.insert(pa.end(), {40, 41});
    pb.insert(pb.end(), {50, 51, 52});
    auto a = f.submit(pa, 3);
    run_until_idle(f.sched);
    EXPECT_EQ(drain(*a).tokens, Fixture::expected(pa, 3));
    EXPECT_EQ(f.metrics.prefill_tokens.load(), 14);
    const int64_t processed = f.engine.tokens_processed;
    auto b = f.submit(pb, 3);
    run_until_idle(f.sched);
    Collected cb = drain(*b);
    EXPECT_EQ(cb.tokens, Fixture::expected(pb, 3));
    EXPECT_EQ(cb.prompt_tokens, 15);  // usage still counts the whole prompt
    const int64_t b_prefill = f.metrics.prefill_tokens.load() - 14;
    EXPECT_EQ(b_prefill, caching ? 3 : 15) << "caching " << caching;
    EXPECT_EQ(f.engine.tokens_processed - processed, (caching ? 3 : 15) + 2);  // + 2 decodes
    EXPECT_EQ(f.metrics.prefix_cache_queries.load(), 14 + 15);  // asked either way
    EXPECT_EQ(f.metrics.prefix_cache_hits.load(), caching ? 12 : 0);
    EXPECT_EQ(f.metrics.prompt_tokens.load(), 14 + 15);
    const std::string m = f.metrics.render();
    EXPECT_NE(m.find("afd_prefix_cache_hits_total " + std::to_string(caching ? 12 : 0) + "\n"), std::string::npos);
    EXPECT_NE(m.find("afd_prefix_cache_queries_total 29\n"), std::string::npos);
    EXPECT_EQ(f.engine.live_sequences(), 0);
  }
}

// A preempted sequence is re-admitted with prompt + generated tokens and reuses the blocks
// it had computed; the output is unchanged.
TEST(Scheduler, ReadmissionAfterPreemptionReusesCachedBlocks) {
  SchedulerOptions o;
  Fixture f(/*blocks=*/6, /*block=*/2, o);
  f.engine.prefix_caching = true;
  run_three_over_a_small_cache(f);
  EXPECT_GT(f.metrics.prefix_cache_hits.load(), 0);
  EXPECT_EQ(f.metrics.prefix_cache_hits.load(), f.engine.reused_tokens);
  EXPECT_EQ(f.engine.live_sequences(), 0);
}

TEST(Scheduler, CancelReleasesTheSequence) {
  Fixture f(1000, 4, {});
  auto r = f.submit({1, 2}, 100);
  auto w = f.submit({3}, 100);
  ASSERT_TRUE(f.sched.step().ok());
  EXPECT_EQ(f.engine.live_sequences(), 2);
  r->channel->cancel();
  ASSERT_TRUE(f.sched.step().ok());
  EXPECT_EQ(f.engine.live_sequences(), 1);
  EXPECT_EQ(f.metrics.requests_cancelled.load(), 1);
  w->channel->cancel();
  run_until_idle(f.sched);
  EXPECT_EQ(f.engine.live_sequences(), 0);
}

TEST(Scheduler, BoundedQueueAndEngineErrors) {
  SchedulerOptions o;
  o.max_queue = 2;
  o.step_retry_s = 0;  // no retries: the failed pass fails its requests at once
  Fixture f(1000, 4, o);
  Status s1, s2, s3;
  auto a = f.submit({1}, 3, &s1);
  auto b = f.submit({1}, 3, &s2);
  f.submit({1}, 3, &s3);
  EXPECT_TRUE(s1.is_ok() && s2.is_ok());
  EXPECT_EQ(s3.code(), StatusCode::resource_exhausted);
  f.engine.fail_next = true;
  EXPECT_FALSE(f.sched.step().ok());
  EXPECT_EQ(drain(*a).finish, FinishReason::error);
  EXPECT_EQ(drain(*b).finish, FinishReason::error);
  EXPECT_EQ(f.engine.live_sequences(), 0);
}

// Blocks until the request finishes (or `ms` pass): everything its channel delivered.
Collected collect(SeqRequest& r, int ms = 10000) {
  Collected all;
  const double until = now_s() + ms * 1e-3;
  while (all.finish == FinishReason::none && now_s() < until) {
    for (StreamEvent& e : r.channel->wait(std::chrono::milliseconds(20))) {
      for (auto& t : e.tokens) all.tokens.push_back(t.token);
      if (e.finish != FinishReason::none) {
        all.finish = e.finish;
        all.error = e.error;
      }
    }
  }
  return all;
}

// A forward pass that fails on a lost peer keeps its requests: once the engine is healthy
// again the same batch runs again (the engine left the sequences unchanged), and the
// request completes with exactly the tokens it would have produced.
TEST(Scheduler, StepRetriedOnceTheEngineIsHealthyAgain) {
  SchedulerOptions o;
  o.step_retry_s = 10;
  Fixture f(1000, 4, o);
  f.engine.unhealthy = true;
  f.engine.fail_unavailable = 2;  // the first pass, and its first retry
  f.sched.start();
  auto r = f.submit({1, 2}, 6);
  Collected early = collect(*r, 200);
  EXPECT_EQ(early.finish, FinishReason::none) << "the request ended while the engine was unhealthy";
  EXPECT_TRUE(early.tokens.empty());
  f.engine.unhealthy = false;
  Collected all = collect(*r);
  EXPECT_EQ(all.finish, FinishReason::length);
  EXPECT_EQ(all.tokens, Fixture::expected({1, 2}, 6));
  EXPECT_EQ(f.metrics.worker(0).step_retries.load(), 2);
  f.sched.stop();
}

// ... for at most step_retry_s: then its requests fail with the error, as without retries.
TEST(Scheduler, StepRetryGivesUpAfterItsBudget) {
  SchedulerOptions o;
  o.step_retry_s = 0.3;
  Fixture f(1000, 4, o);
  f.engine.unhealthy = true;
  f.engine.fail_unavailable = 1;
  f.sched.start();
  const double t0 = now_s();
  auto r = f.submit({1, 2}, 6);
  Collected all = collect(*r);
  EXPECT_EQ(all.finish, FinishReason::error);
  EXPECT_GE(now_s() - t0, 0.3);
  EXPECT_EQ(f.metrics.worker(0).step_retries.load(), 0);
  EXPECT_EQ(f.engine.live_sequences(), 0);
  f.sched.stop();
}

TEST(Scheduler, ThreadServesManyConcurrentRequests) {
  SchedulerOptions o;
  o.max_running = 8;
  Fixture f(64, 4, o, 8);
  f.sched.start();
  std::vector<std::shared_ptr<SeqRequest>> rs;
  for (int i = 0; i < 40; ++i) rs.push_back(f.submit({static_cast<int32_t>(i % 200), 1}, 5 + i % 7));
  for (int i = 0; i < 40; ++i) {
    Collected all;
    for (int k = 0; k < 500 && all.finish == FinishReason::none; ++k) {
      for (StreamEvent& e : rs[i]->channel->wait(std::chrono::milliseconds(20))) {
        for (auto& t : e.tokens) all.tokens.push_back(t.token);
        if (e.finish != FinishReason::none) all.finish = e.finish;
      }
    }
    EXPECT_EQ(all.finish, FinishReason::length) << i;
    EXPECT_EQ(all.tokens, Fixture::expected({i % 200, 1}, 5 + i % 7)) << i;
  }
  f.sched.stop();
  EXPECT_EQ(f.engine.live_sequences(), 0);
  EXPECT_LE(f.engine.max_batch_seen, 8);
}

}  // namespace
}  // namespace afd::serve::test_scheduler
