// score_documents (runtime/perplexity.h): the window plan, NLL and top-1 against logits of a
// plain forward, independence from how windows are batched and chunked, KV admission, errors,
// and every sequence released; with DeepSeek's MTP module (load_mtp_module, MtpHead) the same.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "model/weights.h"
#include "runtime/engine_factory.h"
#include "runtime/mtp_head.h"
#include "runtime/perplexity.h"

namespace afd {
namespace {

const char* kModel = AFD_SOURCE_DIR "/tests/reference/data/qwen3_gqa2_top2_untied";

std::unique_ptr<Engine> make(int64_t kv_tokens = 1024) {
  EngineOptions o;
  o.model_dir = kModel;
  o.precision = Precision::reference;
  o.kv.capacity_tokens = kv_tokens;
  o.kv.block_size = 16;
  o.kv.max_seqs = 32;
  auto w = load_model(kModel);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  auto e = make_engine(o, *w);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(*e);
}

std::vector<std::vector<int32_t>> documents(int64_t vocab) {
  std::vector<std::vector<int32_t>> d;
  uint32_t x = 12345;
  for (int64_t len : {1, 2, 7, 40, 100, 3}) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < len; ++i) {
      x = x * 1664525u + 1013904223u;
      t.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab)));
    }
    d.push_back(std::move(t));
  }
  return d;
}

TEST(ScoreWindows, PlanScoresEveryTokenAfterTheFirstOnce) {
  EXPECT_TRUE(plan_score_windows(0, 8, 4).empty());
  EXPECT_TRUE(plan_score_windows(1, 8, 4).empty());
  auto one = plan_score_windows(8, 8, 4);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].begin, 0);
  EXPECT_EQ(one[0].end, 8);
  EXPECT_EQ(one[0].score_begin, 1);
  // 20 tokens, window 8, stride 5: [0,8) scores 1..7, [5,13) 8..12, [10,18) 13..17, [15,20) 18..19.
  auto w = plan_score_windows(20, 8, 5);
  ASSERT_EQ(w.size(), 4u);
  const int64_t want[4][3] = {{0, 8, 1}, {5, 13, 8}, {10, 18, 13}, {15, 20, 18}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(w[i].begin, want[i][0]) << i;
    EXPECT_EQ(w[i].end, want[i][1]) << i;
    EXPECT_EQ(w[i].score_begin, want[i][2]) << i;
  }
  for (int64_t n : {2, 9, 31, 100}) {
    for (int64_t stride : {1, 3, 7}) {
      int64_t scored = 0, prev = 1;
      for (const ScoreWindow& s : plan_score_windows(n, 8, stride)) {
        EXPECT_EQ(s.score_begin, prev);
        EXPECT_LE(s.end - s.begin, 8);
        scored += s.end - s.score_begin;
        prev = s.end;
      }
      EXPECT_EQ(scored, n - 1) << n << " " << stride;
    }
  }
  // stride == window: independent windows, each window's first token unscored.
  auto indep = plan_score_windows(20, 8, 8);
  ASSERT_EQ(indep.size(), 3u);
  EXPECT_EQ(indep[1].score_begin, 9);
}

// NLL / top-1 of whole documents straight from one forward with all_logits each.
ScoreResult direct(Engine& e, const std::vector<std::vector<int32_t>>& docs) {
  ScoreResult r;
  const int64_t V = e.config().vocab_size;
  for (const auto& d : docs) {
    if (d.size() < 2) continue;
    auto s = e.create_sequence();
    EXPECT_TRUE(s.ok());
    BatchItem it{*s, d, true};
    std::vector<float> logits;
    EXPECT_TRUE(e.forward(std::span<const BatchItem>(&it, 1), &logits).is_ok());
    for (size_t t = 1; t < d.size(); ++t) {
      const float* row = &logits[(t - 1) * V];
      double m = row[0], sum = 0;
      int64_t arg = 0;
      for (int64_t v = 1; v < V; ++v) {
        if (row[v] > row[arg]) arg = v;
      }
      m = row[arg];
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - m);
      r.nll_sum += m + std::log(sum) - row[d[t]];
      r.top1_correct += arg == d[t];
      r.tokens += 1;
    }
    e.release_sequence(*s);
  }
  return r;
}

TEST(ScoreDocuments, WholeDocumentsEqualADirectForward) {
  auto e = make();
  const auto docs = documents(e->config().vocab_size);
  ScoreOptions o;
  o.window = 128;
  o.stride = 64;
  int calls = 0;
  o.progress = [&](int64_t done, int64_t total) {
    ++calls;
    EXPECT_LE(done, total);
  };
  auto r = score_documents(*e, docs, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ScoreResult want = direct(*e, docs);
  EXPECT_EQ(r->documents, 6);
  EXPECT_EQ(r->tokens, want.tokens);
  EXPECT_EQ(r->tokens, 1 + 6 + 39 + 99 + 2);
  EXPECT_EQ(r->forwarded_tokens, 2 + 7 + 40 + 100 + 3);
  EXPECT_NEAR(r->nll_sum, want.nll_sum, 1e-6 * want.nll_sum);
  EXPECT_EQ(r->top1_correct, want.top1_correct);
  EXPECT_GE(calls, 1);
  EXPECT_EQ(e->kv_usage().blocks_used, 0) << "every sequence released";
}

TEST(ScoreDocuments, BatchingAndChunkingDoNotChangeTheScores) {
  auto e = make();
  const auto docs = documents(e->config().vocab_size);
  ScoreOptions o;
  o.window = 24;
  o.stride = 10;
  auto base = score_documents(*e, docs, o);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  EXPECT_EQ(base->tokens, 1 + 6 + 39 + 99 + 2);
  for (auto [seqs, tokens] : {std::pair<int64_t, int64_t>{1, 4096}, {3, 7}, {16, 1}, {2, 50}}) {
    ScoreOptions c = o;
    c.max_seqs_per_call = seqs;
    c.max_tokens_per_call = tokens;
    auto r = score_documents(*e, docs, c);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->tokens, base->tokens);
    EXPECT_EQ(r->forwarded_tokens, base->forwarded_tokens);
    EXPECT_NEAR(r->nll_sum, base->nll_sum, 1e-6 * base->nll_sum) << seqs << " " << tokens;
    EXPECT_EQ(r->top1_correct, base->top1_correct);
  }
  EXPECT_EQ(e->kv_usage().blocks_used, 0);
}

TEST(ScoreDocuments, WindowsWaitForKvBlocksAndAWindowTooLargeIsAnError) {
  auto e = make(/*kv_tokens=*/64);  // 4 blocks: one 40-token window (3 blocks) at a time
  const auto docs = documents(e->config().vocab_size);
  ScoreOptions o;
  o.window = 40;
  o.stride = 20;
  auto r = score_documents(*e, docs, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, 1 + 6 + 39 + 99 + 2);
  o.window = 80;
  o.stride = 40;
  r = score_documents(*e, docs, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::resource_exhausted);
  EXPECT_EQ(e->kv_usage().blocks_used, 0);
}

TEST(ScoreDocuments, BadArgumentsAreErrors) {
  auto e = make();
  const auto docs = documents(e->config().vocab_size);
  auto code = [&](int64_t window, int64_t stride) {
    ScoreOptions o;
    o.window = window;
    o.stride = stride;
    auto r = score_documents(*e, docs, o);
    return r.ok() ? StatusCode::ok : r.status().code();
  };
  EXPECT_EQ(code(1, 1), StatusCode::invalid_argument);
  EXPECT_EQ(code(8, 0), StatusCode::invalid_argument);
  EXPECT_EQ(code(8, 9), StatusCode::invalid_argument);
  EXPECT_EQ(code(e->config().max_position_embeddings + 1, 8), StatusCode::invalid_argument);
  auto bad = docs;
  bad[3][5] = static_cast<int32_t>(e->config().vocab_size);
  ScoreOptions o;
  o.window = 64;
  o.stride = 32;
  auto r = score_documents(*e, bad, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("document 3"), std::string::npos) << r.status().to_string();
}

// ---- DeepSeek's MTP module (the golden DeepSeek-V3 checkpoint has one) ----

const char* kMtpModel = AFD_SOURCE_DIR "/tests/reference/data/dsv3_tiny_fp8";

TEST(MtpModule, LoadsAsAOneLayerModelAndRefusesWhatIsNotThere) {
  auto w = load_model(kMtpModel);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto m = load_mtp_module(*w, 0);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelConfig& c = m->block->config;
  EXPECT_EQ(c.n_layers, 1);
  ASSERT_EQ(m->block->layers.size(), 1u);
  EXPECT_EQ(m->block->layers[0].is_moe, (*w)->config.is_moe_layer((*w)->config.n_layers));
  EXPECT_TRUE(c.is_moe_layer(0));
  EXPECT_EQ(m->eh_proj.rows, c.hidden_size);
  EXPECT_EQ(m->eh_proj.cols, 2 * c.hidden_size);
  EXPECT_EQ(m->block->lm_head.rows, c.vocab_size);
  auto missing = load_mtp_module(*w, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("num_nextn_predict_layers is 1"), std::string::npos);
  auto qwen = load_model(kModel);
  ASSERT_TRUE(qwen.ok());
  EXPECT_EQ(load_mtp_module(*qwen, 0).status().code(), StatusCode::not_supported);
}

struct WithMtp {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<MtpHead> head;
};

WithMtp make_with_mtp() {
  auto w = load_model(kMtpModel);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  EngineOptions o;
  o.precision = Precision::reference;
  o.kv.capacity_tokens = 1024;
  o.kv.max_seqs = 32;
  auto e = make_engine(o, *w);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  auto m = load_mtp_module(*w, 0);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  auto h = MtpHead::create(std::move(*m), o);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  return {std::move(*e), std::move(*h)};
}

TEST(ScoreDocumentsMtp, CountsTheTokenAfterNextAndDoesNotDependOnBatching) {
  WithMtp x = make_with_mtp();
  const auto docs = documents(x.engine->config().vocab_size);
  ScoreOptions o;
  o.window = 128;
  o.stride = 64;
  auto plain = score_documents(*x.engine, docs, o);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->mtp_tokens, 0);
  o.mtp = x.head.get();
  auto base = score_documents(*x.engine, docs, o);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  EXPECT_EQ(base->mtp_tokens, 0 + 5 + 38 + 98 + 1);  // n - 2 per document
  EXPECT_EQ(base->nll_sum, plain->nll_sum);
  EXPECT_EQ(base->top1_correct, plain->top1_correct);
  EXPECT_GT(base->mtp_nll_sum, 0);
  for (auto [window, stride, seqs, tokens] :
       {std::array<int64_t, 4>{128, 64, 1, 4096}, {128, 64, 3, 7}, {24, 10, 16, 5}, {24, 10, 2, 50}}) {
    ScoreOptions c = o;
    c.window = window;
    c.stride = stride;
    c.max_seqs_per_call = seqs;
    c.max_tokens_per_call = tokens;
    auto r = score_documents(*x.engine, docs, c);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (window == 128) {
      EXPECT_EQ(r->mtp_tokens, base->mtp_tokens);
      EXPECT_NEAR(r->mtp_nll_sum, base->mtp_nll_sum, 1e-6 * base->mtp_nll_sum) << seqs << " " << tokens;
      EXPECT_EQ(r->mtp_top1_correct, base->mtp_top1_correct);
    } else {
      ScoreOptions one = c;
      one.max_seqs_per_call = 16;
      one.max_tokens_per_call = 4096;
      auto want = score_documents(*x.engine, docs, one);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(r->mtp_tokens, want->mtp_tokens);
      EXPECT_NEAR(r->mtp_nll_sum, want->mtp_nll_sum, 1e-6 * want->mtp_nll_sum);
      EXPECT_EQ(r->mtp_top1_correct, want->mtp_top1_correct);
    }
  }
  EXPECT_EQ(x.engine->kv_usage().blocks_used, 0);
  EXPECT_EQ(x.head->kv_usage().blocks_used, 0);
}

TEST(ScoreDocumentsMtp, AnEngineWithoutHiddenStatesIsAnError) {
  // A wrapper that only forwards forward(): forward_with_hidden stays not_supported.
  struct Plain : Engine {
    Engine& e;
    explicit Plain(Engine& inner) : e(inner) {}
    const ModelConfig& config() const override { return e.config(); }
    Result<int64_t> create_sequence() override { return e.create_sequence(); }
    void release_sequence(int64_t s) override { e.release_sequence(s); }
    int64_t sequence_length(int64_t s) const override { return e.sequence_length(s); }
    bool can_append(int64_t s, int64_t n) const override { return e.can_append(s, n); }
    int64_t kv_blocks_needed(int64_t s, int64_t n) const override { return e.kv_blocks_needed(s, n); }
    int kv_pool(int64_t s) const override { return e.kv_pool(s); }
    KvUsage kv_pool_usage(int p) const override { return e.kv_pool_usage(p); }
    Status forward(std::span<const BatchItem> items, std::vector<float>* logits) override {
      return e.forward(items, logits);
    }
    KvUsage kv_usage() const override { return e.kv_usage(); }
  };
  WithMtp x = make_with_mtp();
  Plain p(*x.engine);
  ScoreOptions o;
  o.window = 64;
  o.stride = 32;
  o.mtp = x.head.get();
  auto r = score_documents(p, documents(p.config().vocab_size), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::not_supported);
  EXPECT_EQ(x.engine->kv_usage().blocks_used, 0);
  EXPECT_EQ(x.head->kv_usage().blocks_used, 0);
}

}  // namespace
}  // namespace afd
