// PipelineEngine behaviour that the golden tests do not cover: validation leaves state
// unchanged, KV accounting, batch composition invariance, FP8-dispatch rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "model/weights.h"
#include "runtime/bundle.h"
#include "runtime/cuda_ffn.h"
#include "runtime/engine_factory.h"
#include "runtime/generate.h"
#include "runtime/pipeline_engine.h"

namespace afd {
namespace {

const char* kModel = AFD_SOURCE_DIR "/tests/reference/data/qwen3_gqa2_top2_untied";

// make_engine over the weights in o.model_dir (loaded once per directory).
Result<std::unique_ptr<Engine>> engine_of(const EngineOptions& o) {
  static std::map<std::string, std::shared_ptr<const ModelWeights>> loaded;
  auto& w = loaded[o.model_dir];
  if (!w) {
    auto l = load_model(o.model_dir);
    if (!l.ok()) return l.status();
    w = std::move(*l);
  }
  return make_engine(o, w);
}

std::unique_ptr<Engine> make(Precision p, int64_t kv_tokens = 512, int mb = 1, bool fp8 = false) {
  EngineOptions o;
  o.model_dir = kModel;
  o.precision = p;
  o.kv.capacity_tokens = kv_tokens;
  o.kv.block_size = 16;
  o.kv.max_seqs = 4;
  o.microbatches = mb;
  o.emulation.fp8_dispatch = fp8;
  auto e = engine_of(o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(*e);
}

// The caller loads the weights: make_engine never reads the model directory itself.
TEST(Engine, MakeEngineNeedsLoadedWeights) {
  EngineOptions o;
  o.model_dir = kModel;
  auto e = make_engine(o, nullptr);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::invalid_argument) << e.status().to_string();
}

TEST(Engine, InvalidBatchesLeaveStateUnchanged) {
  auto e = make(Precision::reference);
  auto a = e->create_sequence();
  ASSERT_TRUE(a.ok());
  std::vector<int32_t> ok_toks = {1, 2, 3}, bad = {1, 100000};
  std::vector<float> logits;
  BatchItem good{*a, ok_toks, false};
  ASSERT_TRUE(e->forward(std::span<const BatchItem>(&good, 1), &logits).is_ok());
  EXPECT_EQ(e->sequence_length(*a), 3);
  const int64_t used = e->kv_usage().blocks_used;

  BatchItem items[2] = {{*a, ok_toks, false}, {*a, ok_toks, false}};
  EXPECT_EQ(e->forward(items, &logits).code(), StatusCode::invalid_argument);  // same seq twice
  BatchItem vocab{*a, bad, false};
  EXPECT_EQ(e->forward(std::span<const BatchItem>(&vocab, 1), &logits).code(), StatusCode::out_of_range);
  BatchItem unknown{12345, ok_toks, false};
  EXPECT_EQ(e->forward(std::span<const BatchItem>(&unknown, 1), &logits).code(), StatusCode::invalid_argument);
  EXPECT_EQ(e->sequence_length(*a), 3);
  EXPECT_EQ(e->kv_usage().blocks_used, used);
}

TEST(Engine, KvExhaustionIsAnErrorAndReleaseFrees) {
  auto e = make(Precision::fast, /*kv_tokens=*/32);  // 2 blocks of 16
  auto a = e->create_sequence();
  ASSERT_TRUE(a.ok());
  std::vector<int32_t> toks(20, 5);
  std::vector<float> logits;
  BatchItem it{*a, toks, false};
  ASSERT_TRUE(e->forward(std::span<const BatchItem>(&it, 1), &logits).is_ok());
  EXPECT_EQ(e->kv_usage().blocks_used, 2);
  EXPECT_FALSE(e->can_append(*a, 13));
  EXPECT_TRUE(e->can_append(*a, 12));
  std::vector<int32_t> more(13, 7);
  BatchItem it2{*a, more, false};
  EXPECT_EQ(e->forward(std::span<const BatchItem>(&it2, 1), &logits).code(), StatusCode::resource_exhausted);
  EXPECT_EQ(e->sequence_length(*a), 20);
  e->release_sequence(*a);
  EXPECT_EQ(e->kv_usage().blocks_used, 0);
}

TEST(Engine, MaxSequences) {
  auto e = make(Precision::fast);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e->create_sequence().ok());
  EXPECT_EQ(e->create_sequence().status().code(), StatusCode::resource_exhausted);
}

// A sequence's logits do not depend on what else is in the batch (reference precision).
TEST(Engine, BatchCompositionInvariance) {
  auto e = make(Precision::reference, 1024);
  std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6}, {2, 7}, {1, 8, 2, 8, 1, 8}};
  GenerateOptions o;
  o.max_new_tokens = 8;
  o.stop_at_eos = false;
  o.keep_logits = true;
  auto together = generate(*e, prompts, o);
  ASSERT_TRUE(together.ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = generate(*e, {prompts[i]}, o);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(alone->tokens[0], together->tokens[i]);
    ASSERT_EQ(alone->logits[0].size(), together->logits[i].size());
    float worst = 0;
    for (size_t k = 0; k < alone->logits[0].size(); ++k)
      worst = std::max(worst, std::fabs(alone->logits[0][k] - together->logits[i][k]));
    EXPECT_LE(worst, 1e-5f) << "prompt " << i;
  }
}

// FP8 dispatch changes the FFN input only by e4m3 rounding: logits move, but little.
TEST(Engine, Fp8DispatchDeviationIsSmall) {
  std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6}};
  GenerateOptions o;
  o.max_new_tokens = 1;
  o.keep_logits = true;
  auto ref = generate(*make(Precision::reference), prompts, o);
  auto fp8 = generate(*make(Precision::reference, 512, 1, true), prompts, o);
  ASSERT_TRUE(ref.ok() && fp8.ok());
  float worst = 0, scale = 0;
  for (size_t k = 0; k < ref->logits[0].size(); ++k) {
    worst = std::max(worst, std::fabs(ref->logits[0][k] - fp8->logits[0][k]));
    scale = std::max(scale, std::fabs(ref->logits[0][k]));
  }
  EXPECT_GT(worst, 0.0f);           // the rounding really happens
  EXPECT_LT(worst, 0.25f * scale);  // and stays a rounding (routing flips aside)
}


// ---- prefix caching (Engine::reuse_prefix) ----

std::unique_ptr<Engine> make_cached(bool caching, const std::string& topology = "mono", int64_t kv_tokens = 1024) {
  EngineOptions o;
  o.model_dir = kModel;
  o.precision = Precision::reference;
  o.kv.capacity_tokens = kv_tokens;
  o.kv.block_size = 16;
  o.kv.max_seqs = 4;
  o.topology = *parse_topology(topology);
  o.kv.prefix_caching = caching;
  auto e = engine_of(o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(*e);
}

struct GreedyRun {
  std::vector<int32_t> tokens;            // generated
  std::vector<std::vector<float>> logits;  // one row per generated token
  int64_t reused = 0;                      // tokens mapped from the cache at the start
};

// Greedy decoding of n tokens after `context` on a new sequence that first asks the
// engine for a cached prefix; the sequence is released at the end unless keep.
GreedyRun greedy(Engine& e, const std::vector<int32_t>& context, int n, int64_t* keep_seq = nullptr) {
  GreedyRun r;
  auto seq = e.create_sequence();
  EXPECT_TRUE(seq.ok());
  r.reused = e.reuse_prefix(*seq, context);
  EXPECT_EQ(e.sequence_length(*seq), r.reused);
  EXPECT_LT(r.reused, static_cast<int64_t>(context.size()));
  std::vector<int32_t> next(context.begin() + r.reused, context.end());
  const int64_t V = e.config().vocab_size;
  for (int i = 0; i < n; ++i) {
    std::vector<float> logits;
    BatchItem it{*seq, next, false};
    Status st = e.forward(std::span<const BatchItem>(&it, 1), &logits);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    EXPECT_EQ(static_cast<int64_t>(logits.size()), V);
    const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.tokens.push_back(t);
    r.logits.push_back(logits);
    next = {t};
  }
  if (keep_seq) *keep_seq = *seq;
  else e.release_sequence(*seq);
  return r;
}

float max_diff(const GreedyRun& a, const GreedyRun& b) {
  float worst = 0;
  EXPECT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < std::min(a.logits.size(), b.logits.size()); ++i)
    for (size_t k = 0; k < a.logits[i].size(); ++k) worst = std::max(worst, std::fabs(a.logits[i][k] - b.logits[i][k]));
  return worst;
}

std::vector<int32_t> with_prefix(const std::vector<int32_t>& prefix, std::vector<int32_t> tail) {
  std::vector<int32_t> t = prefix;
  t.insert(t.end(), tail.begin(), tail.end());
  return t;
}

std::vector<int32_t> shared_prefix() {  // 2 full blocks of 16 + 8 tokens
  std::vector<int32_t> p(40);
  for (int i = 0; i < 40; ++i) p[i] = (i * 37 + 11) % 383;
  return p;
}

void check_shared_prefix_matches_uncached(const std::string& topology) {
  const auto prefix = shared_prefix();
  const auto a = with_prefix(prefix, {5, 6, 7, 8, 9, 10});
  const auto b = with_prefix(prefix, {200, 201, 202});
  const auto c = with_prefix(prefix, {1});
  auto off = make_cached(false, topology);
  GreedyRun a0 = greedy(*off, a, 10), b0 = greedy(*off, b, 10), c0 = greedy(*off, c, 6);
  EXPECT_EQ(b0.reused, 0);
  EXPECT_EQ(c0.reused, 0);

  auto on = make_cached(true, topology);
  int64_t a_seq = -1;
  GreedyRun a1 = greedy(*on, a, 10, &a_seq);  // a stays live: b shares its blocks
  EXPECT_EQ(a1.reused, 0);
  GreedyRun b1 = greedy(*on, b, 10);
  EXPECT_EQ(b1.reused, 32);
  on->release_sequence(a_seq);  // now its blocks are evictable, not freed
  EXPECT_EQ(on->kv_usage().blocks_used, 0);
  GreedyRun c1 = greedy(*on, c, 6);
  EXPECT_EQ(c1.reused, 32);
  // a again, after its own blocks became evictable: 46 prompt tokens, capped at 45 -> 2 blocks.
  GreedyRun a2 = greedy(*on, a, 10);
  EXPECT_EQ(a2.reused, 32);
  EXPECT_EQ(a1.tokens, a0.tokens);
  EXPECT_EQ(b1.tokens, b0.tokens);
  EXPECT_EQ(c1.tokens, c0.tokens);
  EXPECT_EQ(a2.tokens, a0.tokens);
  EXPECT_LE(max_diff(a1, a0), 1e-4f);
  EXPECT_LE(max_diff(b1, b0), 1e-4f);
  EXPECT_LE(max_diff(c1, c0), 1e-4f);
  EXPECT_LE(max_diff(a2, a0), 1e-4f);
}

TEST(EnginePrefixCache, SharedPrefixGivesTheSameTokensAndLogits) { check_shared_prefix_matches_uncached("mono"); }
// DataParallelEngine forwards reuse_prefix to the attention engine holding the sequence.
TEST(EnginePrefixCache, SharedPrefixThroughAnAfdBundle) { check_shared_prefix_matches_uncached("1A1F"); }

// With two attention engines, create_sequence() places b on the lighter engine (a holds
// blocks on the other); reuse_prefix moves the still-empty b to the engine whose cache holds
// the shared prefix, so it is reused, and the result is still exact.
TEST(EnginePrefixCache, DataParallelPlacementFollowsTheCachedPrefix) {
  const auto prefix = shared_prefix();
  const auto a = with_prefix(prefix, {5, 6, 7, 8, 9, 10});
  const auto b = with_prefix(prefix, {200, 201, 202});
  auto off = make_cached(false, "2A1F");
  GreedyRun b0 = greedy(*off, b, 8);
  auto on = make_cached(true, "2A1F");
  int64_t a_seq = -1;
  greedy(*on, a, 4, &a_seq);  // live on one engine, its prefix blocks registered there
  GreedyRun b1 = greedy(*on, b, 8);
  EXPECT_EQ(b1.reused, 32);
  EXPECT_EQ(on->cached_prefix(b), 32);
  EXPECT_EQ(b1.tokens, b0.tokens);
  EXPECT_LE(max_diff(b1, b0), 1e-4f);
  on->release_sequence(a_seq);
}

// A sequence preempted after generating and re-admitted with prompt + generated tokens
// continues exactly as if it had never been interrupted.
TEST(EnginePrefixCache, ReadmissionAfterPreemptionContinuesIdentically) {
  const auto prompt = with_prefix(shared_prefix(), {3, 3});
  auto off = make_cached(false);
  GreedyRun full = greedy(*off, prompt, 20);

  auto on = make_cached(true);
  GreedyRun first = greedy(*on, prompt, 8);  // 42 + 8 tokens; released = preempted
  EXPECT_EQ(first.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + 8));
  // Re-admission recomputes prompt + the 8 generated tokens, minus the cached blocks: the
  // last generated token was never forwarded, so 49 tokens had KV and 3 blocks were full.
  std::vector<int32_t> ctx = with_prefix(prompt, first.tokens);
  GreedyRun rest = greedy(*on, ctx, 12);
  EXPECT_EQ(rest.reused, 48);
  std::vector<int32_t> joined = first.tokens;
  joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(joined, full.tokens);
  float worst = 0;
  for (size_t i = 0; i < rest.logits.size(); ++i)
    for (size_t k = 0; k < rest.logits[i].size(); ++k)
      worst = std::max(worst, std::fabs(rest.logits[i][k] - full.logits[8 + i][k]));
  EXPECT_LE(worst, 1e-4f);
}

// A failed forward leaves no cache entries behind, and a cached prefix never reaches the
// whole prompt (one token is always computed).
TEST(EnginePrefixCache, FailedStepRegistersNothingAndOneTokenIsComputed) {
  auto e = make_cached(true);
  const auto p = shared_prefix();
  std::vector<int32_t> first32(p.begin(), p.begin() + 32);
  auto s = e->create_sequence();
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> bad = first32;
  bad.back() = 100000;  // outside the vocabulary: the whole step fails
  std::vector<float> logits;
  BatchItem it{*s, bad, false};
  EXPECT_FALSE(e->forward(std::span<const BatchItem>(&it, 1), &logits).is_ok());
  EXPECT_EQ(e->sequence_length(*s), 0);
  e->release_sequence(*s);
  auto s2 = e->create_sequence();
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(e->reuse_prefix(*s2, first32), 0);
  BatchItem ok{*s2, first32, false};
  ASSERT_TRUE(e->forward(std::span<const BatchItem>(&ok, 1), &logits).is_ok());
  e->release_sequence(*s2);
  auto s3 = e->create_sequence();
  ASSERT_TRUE(s3.ok());
  EXPECT_EQ(e->reuse_prefix(*s3, first32), 16);  // capped below the full 32-token prompt
  e->release_sequence(*s3);
  auto s4 = e->create_sequence();
  ASSERT_TRUE(s4.ok());
  EXPECT_EQ(e->reuse_prefix(*s4, p), 32);
}

// Per-layer stage times: one entry per layer, attention measured on every layer, the FFN
// stage where it runs (inside dispatch in mono; reported by the FFN workers through the
// reply header in a bundle), and the per-step totals equal to the sums over layers.
// Reference precision, 512 KV tokens, 4 sequences, over `topology`.
EngineOptions small_options(const std::string& topology) {
  EngineOptions o;
  o.model_dir = kModel;
  o.precision = Precision::reference;
  o.kv.capacity_tokens = 512;
  o.kv.max_seqs = 4;
  o.topology = *parse_topology(topology);
  return o;
}

void check_layer_stage_times(const std::string& topology, int microbatches) {
  EngineOptions o = small_options(topology);
  o.microbatches = microbatches;
  auto e = engine_of(o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  std::vector<int32_t> a = {1, 2, 3, 4, 5}, b = {7, 8, 9};
  auto s0 = (*e)->create_sequence(), s1 = (*e)->create_sequence();
  ASSERT_TRUE(s0.ok() && s1.ok());
  std::vector<BatchItem> items = {{*s0, a, false}, {*s1, b, false}};
  std::vector<float> logits;
  ASSERT_TRUE((*e)->forward(items, &logits).is_ok());
  const StageTimes t = (*e)->last_stage_times();
  const int64_t n_layers = (*e)->config().n_layers;
  ASSERT_EQ(static_cast<int64_t>(t.layers.size()), n_layers) << topology;
  double attn = 0, a2f = 0, ffn = 0, f2a = 0;
  for (const LayerStageTimes& l : t.layers) {
    EXPECT_GT(l.attention_s, 0) << topology;
    EXPECT_GT(l.ffn_s, 0) << topology;
    if (topology == "mono") {
      EXPECT_EQ(l.a2f_s, 0);  // the FFN runs inside dispatch: all of it is ffn_s
      EXPECT_EQ(l.f2a_s, 0);
    } else {
      EXPECT_GT(l.a2f_s, 0) << topology;
      EXPECT_GT(l.f2a_s, 0) << topology;
    }
    attn += l.attention_s;
    a2f += l.a2f_s;
    ffn += l.ffn_s;
    f2a += l.f2a_s;
  }
  EXPECT_GE(t.attention_s, attn * 0.999);  // plus embedding and LM head
  EXPECT_NEAR(t.a2f_s, a2f, 1e-9);
  EXPECT_NEAR(t.f2a_s, f2a, 1e-9);
  if (topology == "mono") {
    EXPECT_NEAR(t.ffn_s, ffn, 1e-9);
  }
  EXPECT_LE(attn + a2f + f2a, t.total_s * 1.001 + 1e-4) << topology;
}

TEST(EngineStageTimes, PerLayerMono) { check_layer_stage_times("mono", 1); }
TEST(EngineStageTimes, PerLayerThroughA1A2FBundleWithMicrobatches) { check_layer_stage_times("1A2F", 2); }

// BenchmarkHooks (what afd bench and afd calibrate ask of an engine): a synthetic context
// lengthens a sequence without a forward pass; after a forward, the expert reads, and for an
// in-process bundle each attention engine's tokens (summing to the batch's) and its FFN
// workers' counters.
void check_benchmark_hooks(const std::string& topology, size_t n_attention, size_t n_ffn) {
  auto e = engine_of(small_options(topology));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  BenchmarkHooks* h = (*e)->benchmark_hooks();
  ASSERT_NE(h, nullptr) << topology;
  auto s0 = (*e)->create_sequence(), s1 = (*e)->create_sequence();
  ASSERT_TRUE(s0.ok() && s1.ok());
  ASSERT_TRUE(h->fill_synthetic_context(*s0, 20).is_ok());
  EXPECT_EQ((*e)->sequence_length(*s0), 20);
  EXPECT_FALSE(h->fill_synthetic_context(12345, 4).is_ok());
  std::vector<int32_t> a = {5}, b = {1, 2, 3};
  std::vector<BatchItem> items = {{*s0, a, false}, {*s1, b, false}};
  std::vector<float> logits;
  ASSERT_TRUE((*e)->forward(items, &logits).is_ok());
  EXPECT_GT(h->last_expert_reads(), 0) << topology;
  const std::vector<int64_t> tokens = h->last_engine_tokens();
  ASSERT_EQ(tokens.size(), n_attention) << topology;
  if (n_attention > 0) {
    int64_t sum = 0;
    for (int64_t t : tokens) sum += t;
    EXPECT_EQ(sum, 4);
  }
  const std::vector<const FfnWorkerStats*> ffn = h->ffn_stats();
  ASSERT_EQ(ffn.size(), n_ffn) << topology;
  int64_t ffn_tokens = 0;
  for (const FfnWorkerStats* s : ffn) ffn_tokens += s->tokens.load();
  if (n_ffn > 0) {
    EXPECT_GT(ffn_tokens, 0);
    // Per (layer, expert) counts: over the workers, every MoE layer saw the 4 tokens top-k times.
    const ModelConfig& c = (*e)->config();
    ASSERT_GT(c.n_experts, 0);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      int64_t pairs = 0;
      for (const FfnWorkerStats* s : ffn)
        for (int64_t x = 0; x < c.n_experts; ++x) pairs += s->expert_tokens_at(l, x);
      EXPECT_EQ(pairs, c.is_moe_layer(l) ? 4 * c.n_experts_per_tok : 0) << "layer " << l;
    }
  }
}

TEST(EngineBenchmarkHooks, Mono) { check_benchmark_hooks("mono", 0, 0); }
TEST(EngineBenchmarkHooks, InProcessBundle) { check_benchmark_hooks("2A2F", 2, 2); }

}  // namespace
}  // namespace afd

namespace afd {
namespace {

// --ffn-device: a bad name is refused by validate(); "cuda" without a CUDA build or GPU is
// a clear `unavailable` error from make_engine (mono, in-process bundle), never an abort.
TEST(EngineFfnDevice, UnknownDeviceAndMissingGpuAreClearErrors) {
  EngineOptions o;
  o.model_dir = AFD_SOURCE_DIR "/tests/reference/data/qwen2moe_shared";
  o.ffn_device = "tpu";
  EXPECT_EQ(o.validate().code(), StatusCode::invalid_argument);
  std::string why;
  if (cuda_ffn_available(&why)) GTEST_SKIP() << "a GPU is visible: test_cuda_ffn covers the cuda device";
  EXPECT_FALSE(why.empty());
  o.ffn_device = "cuda";
  for (const char* topo : {"mono", "1A1F"}) {
    o.topology = *parse_topology(topo);
    auto e = engine_of(o);
    ASSERT_FALSE(e.ok()) << topo;
    EXPECT_EQ(e.status().code(), StatusCode::unavailable) << e.status().to_string();
    EXPECT_NE(e.status().to_string().find("CUDA"), std::string::npos) << e.status().to_string();
  }
}

}  // namespace
}  // namespace afd

namespace afd {
namespace {

// The micro-batch count defaults by wiring: 3 for an AFD bundle (issue 3: "default 3"),
// 1 for mono and the EP baseline; an explicit count always wins. Checked on the engines
// make_engine builds, not only on the option.
TEST(EngineMicrobatches, DefaultFollowsTheWiring) {
  EngineOptions o;
  o.model_dir = kModel;
  o.kv.capacity_tokens = 256;
  o.kv.max_seqs = 4;
  EXPECT_EQ(o.microbatches, 0);
  struct Case { const char* topo; int set; int want; };
  for (Case c : {Case{"mono", 0, 1}, Case{"2A1F", 0, 3}, Case{"1A2F", 0, 3}, Case{"EP2", 0, 1},
                 Case{"1A1F", 2, 2}, Case{"mono", 4, 4}}) {
    o.topology = *parse_topology(c.topo);
    o.microbatches = c.set;
    ASSERT_TRUE(o.validate().is_ok()) << c.topo;
    EXPECT_EQ(o.pipeline_microbatches(), c.want) << c.topo << " set " << c.set;
    auto e = engine_of(o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    const Engine* first = e->get();
    if (auto* dp = dynamic_cast<DataParallelEngine*>(e->get())) first = dp->bundle().attention()[0].get();
    auto* pe = dynamic_cast<const PipelineEngine*>(first);
    ASSERT_NE(pe, nullptr) << c.topo;
    EXPECT_EQ(pe->microbatches(), c.want) << c.topo << " set " << c.set;
  }
  o.microbatches = 5;
  EXPECT_EQ(o.validate().code(), StatusCode::invalid_argument);
  o.microbatches = -1;
  EXPECT_EQ(o.validate().code(), StatusCode::invalid_argument);
}

// An in-process bundle whose wire buffers (x*y pairs, m micro-batches, frames of up to
// max_batch_tokens tokens, at both ends) cannot fit in this machine's memory is refused
// with a clear error before anything is allocated (not OOM-killed).
TEST(Engine, InProcessBundleTooLargeForMemoryIsRefused) {
  EngineOptions o;
  o.model_dir = kModel;
  o.precision = Precision::reference;
  o.kv.capacity_tokens = 256;
  o.kv.max_seqs = 4;
  o.topology = *parse_topology("64A64F");
  o.afd.max_batch_tokens = 1 << 20;  // ~100 MB frames x 4096 pairs x 3 micro-batches: no machine has that
  auto e = engine_of(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::resource_exhausted) << e.status().to_string();
  EXPECT_NE(e.status().message().find("wire buffers"), std::string::npos) << e.status().to_string();
  EXPECT_NE(e.status().message().find("64A64F"), std::string::npos) << e.status().to_string();
}

}  // namespace
}  // namespace afd
