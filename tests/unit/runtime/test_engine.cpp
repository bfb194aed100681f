// PipelineEngine behaviour that the golden tests do not cover: validation leaves state
// unchanged, KV accounting, batch composition invariance, FP8-dispatch rounding.
#include <gtest/gtest.h>

#include <cmath>

#include "model/weights.h"
#include "runtime/engine_factory.h"
#include "runtime/generate.h"
#include "runtime/pipeline_engine.h"

namespace afd {
namespace {

const char* kModel = AFD_SOURCE_DIR "/tests/reference/data/qwen3_gqa2_top2_untied";

std::unique_ptr<Engine> make(Precision p, int64_t kv_tokens = 512, int mb = 1, bool fp8 = false) {
  EngineOptions o;
  o.model_dir = kModel;
  o.precision = p;
  o.kv_capacity_tokens = kv_tokens;
  o.kv_block_size = 16;
  o.max_seqs = 4;
  o.microbatches = mb;
  o.fp8_dispatch = fp8;
  auto e = make_engine(o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(*e);
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

}  // namespace
}  // namespace afd
