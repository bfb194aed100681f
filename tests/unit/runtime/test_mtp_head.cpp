// MtpHead (runtime/mtp_head.h) as a recursive drafter: the draft ids of the float64 reference
// (tests/reference/mtp/, written by make_golden_mtp.py with mtp_draft_ref.py) in reference
// precision, for an MTP layer with its own embed_tokens / shared_head.head and for one without
// (the main model's then); block_out, sequence_length and truncate, and a truncated-then-
// recomputed position equal, bit for bit, to one never preceded by speculative positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "kernels/cpu/ops.h"
#include "model/weights.h"
#include "runtime/engine_factory.h"
#include "runtime/mtp_head.h"
#include "mtp_golden.h"

namespace afd {
namespace {

using test::kMtpMinMargin;
using test::kMtpOwnHead;
using test::kMtpSharedHead;
using Golden = test::MtpGolden;
using test::load_mtp_golden;

struct WithHead {
  std::shared_ptr<const ModelWeights> main;
  std::shared_ptr<const ModelWeights> block;  // the module as loaded (for shared_head.norm)
  std::unique_ptr<Engine> engine;
  std::unique_ptr<MtpHead> head;
};

WithHead make(const std::string& dir, int64_t block_size = 16) {
  WithHead s;
  auto w = load_model(dir);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  s.main = *w;
  EngineOptions o;
  o.precision = Precision::reference;
  o.kv.capacity_tokens = 1024;
  o.kv.block_size = block_size;
  o.kv.max_seqs = 4;
  auto e = make_engine(o, s.main);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  s.engine = std::move(*e);
  auto m = load_mtp_module(s.main, 0);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  s.block = m->block;
  auto h = MtpHead::create(std::move(*m), o);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  s.head = std::move(*h);
  return s;
}

// The main model's final-normed hidden states [T, hidden] over tokens (teacher-forced).
std::vector<float> main_hidden(Engine& e, const std::vector<int32_t>& tokens) {
  auto seq = e.create_sequence();
  EXPECT_TRUE(seq.ok());
  BatchItem it{*seq, tokens, /*all_logits=*/true};
  std::vector<float> logits, hidden;
  Status st = e.forward_with_hidden({&it, 1}, &logits, &hidden);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  e.release_sequence(*seq);
  return hidden;
}

int32_t argmax(const std::vector<float>& row) {  // the lowest id on ties
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// How the hidden input of draft step j > 1 is made from the previous step's block output.
using Feed = std::function<void(std::vector<float>* block)>;

struct Tally {
  int64_t drafts = 0, checked = 0, wrong = 0;
};

// Drafts k tokens at every position of every golden sequence exactly as mtp_draft_ref does, with
// `feed` applied to the block output between steps, and compares them with the golden.
Tally draft_and_compare(WithHead& s, const Golden& g, const Feed& feed, bool expect_equal) {
  const int64_t H = s.head->config().hidden_size;
  Tally t;
  size_t row = 0;
  for (size_t q = 0; q < g.sequences.size(); ++q) {
    const std::vector<int32_t>& toks = g.sequences[q];
    const std::vector<float> hidden = main_hidden(*s.engine, toks);
    EXPECT_EQ(static_cast<int64_t>(hidden.size()), static_cast<int64_t>(toks.size()) * H);
    auto ms = s.head->create_sequence();
    EXPECT_TRUE(ms.ok());
    for (int64_t i = 0; i + 1 < static_cast<int64_t>(toks.size()); ++i, ++row) {
      EXPECT_EQ(s.head->sequence_length(*ms), i);
      EXPECT_EQ(g.positions[row][0], static_cast<int64_t>(q));
      EXPECT_EQ(g.positions[row][1], i);
      std::vector<float> h(hidden.begin() + i * H, hidden.begin() + (i + 1) * H), logits, block;
      int32_t next = toks[static_cast<size_t>(i + 1)];
      bool comparable = true;
      for (int64_t j = 0; j < g.k; ++j) {
        MtpHead::Item it{*ms, h, {&next, 1}};
        Status st = s.head->forward({&it, 1}, &logits, &block);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        EXPECT_EQ(static_cast<int64_t>(block.size()), H);
        const int32_t d = argmax(logits);
        ++t.drafts;
        comparable = comparable && g.margins[row][static_cast<size_t>(j)] > kMtpMinMargin;
        if (comparable) {
          ++t.checked;
          const int64_t want = g.positions[row][static_cast<size_t>(2 + j)];
          if (d != want) ++t.wrong;
          if (expect_equal) {
            EXPECT_EQ(d, want) << "sequence " << q << " position " << i << " draft " << j + 1;
          }
        }
        feed(&block);
        h = block;
        next = d;
      }
      s.head->truncate(*ms, i + 1);
      EXPECT_EQ(s.head->sequence_length(*ms), i + 1);
    }
    s.head->release_sequence(*ms);
  }
  EXPECT_EQ(row, g.positions.size());
  EXPECT_EQ(s.head->kv_usage().blocks_used, 0);
  return t;
}

void expect_drafts_match(const std::string& dir) {
  WithHead s = make(dir);
  const Golden g = load_mtp_golden(dir);
  ASSERT_EQ(g.k, 3);
  const Tally t = draft_and_compare(
      s, g, [](std::vector<float>*) {}, /*expect_equal=*/true);
  EXPECT_EQ(t.drafts, static_cast<int64_t>(g.positions.size()) * g.k);
  EXPECT_GE(t.drafts, 100);
  EXPECT_GE(t.checked * 10, t.drafts * 9) << t.checked << " of " << t.drafts << " drafts compared";
  EXPECT_EQ(t.wrong, 0);
}

TEST(MtpHeadDrafts, WithTheModulesOwnEmbeddingAndHeadMatchTheFloat64Reference) { expect_drafts_match(kMtpOwnHead); }

TEST(MtpHeadDrafts, WithTheMainModelsEmbeddingAndHeadMatchTheFloat64Reference) { expect_drafts_match(kMtpSharedHead); }

// The golden tells the recursion's hidden input apart: feeding the next step
// rmsnorm(block, shared_head.norm) (the state the head multiplies) instead of the block output
// drafts other ids at some positions.
TEST(MtpHeadDrafts, FeedingTheNormedStateInsteadOfTheBlockOutputDraftsOtherIds) {
  for (const std::string& dir : {kMtpOwnHead, kMtpSharedHead}) {
    SCOPED_TRACE(dir);
    WithHead s = make(dir);
    const Golden g = load_mtp_golden(dir);
    const ModelConfig& c = s.head->config();
    const Vector norm = s.block->final_norm;
    const Feed normed = [&](std::vector<float>* b) {
      std::vector<float> in = *b;
      kernels::rmsnorm(in.data(), norm.data, 1, c.hidden_size, static_cast<float>(c.rms_norm_eps), b->data());
    };
    const Tally t = draft_and_compare(s, g, normed, /*expect_equal=*/false);
    EXPECT_GT(t.wrong, 0);
  }
}

TEST(MtpModule, AbsentEmbeddingAndHeadAreTheMainModels) {
  auto shared = load_model(kMtpSharedHead);
  ASSERT_TRUE(shared.ok()) << shared.status().to_string();
  auto m = load_mtp_module(*shared, 0);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->block->embed.data, (*shared)->embed.data);
  EXPECT_EQ(m->block->lm_head.data, (*shared)->lm_head.data);
  EXPECT_EQ(m->block->lm_head.rows, (*shared)->config.vocab_size);
  auto own = load_model(kMtpOwnHead);
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  auto o = load_mtp_module(*own, 0);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_NE(o->block->embed.data, (*own)->embed.data);
  EXPECT_NE(o->block->lm_head.data, (*own)->lm_head.data);
  const size_t bytes = o->block->embed.nbytes();
  ASSERT_EQ(bytes, (*own)->embed.nbytes());
  EXPECT_NE(std::memcmp(o->block->embed.data, (*own)->embed.data, bytes), 0);  // drawn apart
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Speculative positions appended then truncated leave no trace: the true positions computed
// after the truncation give the same logits and block outputs, bit for bit, as on a sequence that
// never had them — also when the speculative positions opened a new KV block (block size 4).
TEST(MtpHead, TruncateThenRecomputeEqualsNeverAppendedBitForBit) {
  WithHead s = make(kMtpSharedHead, /*block_size=*/4);
  const Golden g = load_mtp_golden(kMtpSharedHead);
  const std::vector<int32_t>& toks = g.sequences[1];
  ASSERT_GE(toks.size(), 12u);
  const int64_t H = s.head->config().hidden_size;
  const std::vector<float> hidden = main_hidden(*s.engine, toks);
  auto rows = [&](int64_t from, int64_t n) {
    return std::span<const float>(hidden.data() + from * H, static_cast<size_t>(n * H));
  };
  auto next = [&](int64_t from, int64_t n) {
    return std::span<const int32_t>(toks.data() + from + 1, static_cast<size_t>(n));
  };
  auto a = s.head->create_sequence(), b = s.head->create_sequence();
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> la, lb, ba, bb;
  // Both hold the true positions 0..5 (blocks [0,4) and [4,6) of [4,8)).
  for (int64_t seq : {*a, *b}) {
    MtpHead::Item it{seq, rows(0, 6), next(0, 6)};
    ASSERT_TRUE(s.head->forward({&it, 1}, &la, &ba).is_ok());
  }
  const int64_t blocks_before = s.head->kv_usage().blocks_used;
  // a drafts from position 6: 6 on true inputs, then 7, 8, 9 on its own drafts (a new block);
  // all four are dropped again.
  {
    MtpHead::Item it{*a, rows(6, 1), next(6, 1)};
    ASSERT_TRUE(s.head->forward({&it, 1}, &la, &ba).is_ok());
    int32_t d = argmax(la);
    for (int j = 0; j < 3; ++j) {
      std::vector<float> h = ba;
      MtpHead::Item sp{*a, h, {&d, 1}};
      ASSERT_TRUE(s.head->forward({&sp, 1}, &la, &ba).is_ok());
      d = argmax(la);
    }
  }
  EXPECT_EQ(s.head->sequence_length(*a), 10);
  EXPECT_EQ(s.head->kv_usage().blocks_used, blocks_before + 1);
  s.head->truncate(*a, 6);
  EXPECT_EQ(s.head->sequence_length(*a), 6);
  EXPECT_EQ(s.head->kv_usage().blocks_used, blocks_before);
  // Then both compute the true positions 6..11.
  MtpHead::Item ia{*a, rows(6, 6), next(6, 6)}, ib{*b, rows(6, 6), next(6, 6)};
  ASSERT_TRUE(s.head->forward({&ia, 1}, &la, &ba).is_ok());
  ASSERT_TRUE(s.head->forward({&ib, 1}, &lb, &bb).is_ok());
  EXPECT_EQ(la.size(), static_cast<size_t>(6 * s.head->config().vocab_size));
  EXPECT_EQ(ba.size(), static_cast<size_t>(6 * H));
  EXPECT_TRUE(same_bits(la, lb));
  EXPECT_TRUE(same_bits(ba, bb));
  s.head->release_sequence(*a);
  s.head->release_sequence(*b);
  EXPECT_EQ(s.head->kv_usage().blocks_used, 0);
}

TEST(MtpHead, SequenceLengthAndTruncateEdgeCases) {
  WithHead s = make(kMtpSharedHead, /*block_size=*/4);
  const Golden g = load_mtp_golden(kMtpSharedHead);
  const std::vector<int32_t>& toks = g.sequences[0];
  const int64_t H = s.head->config().hidden_size;
  const std::vector<float> hidden = main_hidden(*s.engine, toks);
  EXPECT_EQ(s.head->sequence_length(12345), -1);
  s.head->truncate(12345, 0);  // unknown: ignored
  auto q = s.head->create_sequence();
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(s.head->sequence_length(*q), 0);
  s.head->truncate(*q, 0);
  EXPECT_EQ(s.head->sequence_length(*q), 0);
  MtpHead::Item it{*q, std::span<const float>(hidden.data(), static_cast<size_t>(5 * H)),
                   std::span<const int32_t>(toks.data() + 1, 5)};
  std::vector<float> logits, block;
  ASSERT_TRUE(s.head->forward({&it, 1}, &logits, &block).is_ok());
  EXPECT_EQ(block.size(), static_cast<size_t>(5 * H));
  EXPECT_EQ(s.head->sequence_length(*q), 5);
  s.head->truncate(*q, 5);  // not shorter: no-op
  s.head->truncate(*q, 9);
  EXPECT_EQ(s.head->sequence_length(*q), 5);
  EXPECT_EQ(s.head->kv_usage().blocks_used, 2);
  s.head->truncate(*q, 4);
  EXPECT_EQ(s.head->sequence_length(*q), 4);
  EXPECT_EQ(s.head->kv_usage().blocks_used, 1);
  s.head->truncate(*q, 0);
  EXPECT_EQ(s.head->sequence_length(*q), 0);
  EXPECT_EQ(s.head->kv_usage().blocks_used, 0);
  // Without block_out, forward is as before; an error leaves block_out and the length alone.
  std::vector<float> plain;
  ASSERT_TRUE(s.head->forward({&it, 1}, &plain).is_ok());
  EXPECT_EQ(plain.size(), logits.size());
  int32_t bad = static_cast<int32_t>(s.head->config().vocab_size);
  MtpHead::Item wrong{*q, std::span<const float>(hidden.data(), static_cast<size_t>(H)), {&bad, 1}};
  block.assign(3, 1.0f);
  EXPECT_FALSE(s.head->forward({&wrong, 1}, &logits, &block).is_ok());
  EXPECT_EQ(block.size(), 3u);
  EXPECT_EQ(s.head->sequence_length(*q), 5);
}

}  // namespace
}  // namespace afd
