// MtpDrafter (runtime/speculative.h) against the float64 golden of tests/reference/mtp/: the
// golden's sequences replayed through the drafting path that generate() and the scheduler
// drive — the main engine's forward_with_hidden in reference precision, MtpDrafter::observe of
// the final positions, propose with up to 3 drafts (the one module applied recursively) — give
// the golden's draft ids at every position the golden lists. Positions are observed as
// generate() does (the prompt's rows at once, then one position per step), several per call
// (as after accepted drafts, the rejected draft's KV dropped by Engine::settle_drafts), every
// sequence in one propose call with fewer drafts asked for at some steps; the drafts agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "model/weights.h"
#include "runtime/engine_factory.h"
#include "runtime/speculative.h"
#include "mtp_golden.h"

namespace afd {
namespace {

using test::kMtpMinMargin;
using test::kMtpOwnHead;
using test::kMtpSharedHead;

// The golden by (sequence, position).
struct Golden {
  int64_t k = 0;
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int64_t> prompt_lengths;
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> drafts;  // (sequence, i) -> d1 .. dk
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> margins;  // (sequence, i) -> m1 .. mk
};

Golden load_golden(const std::string& dir) {
  test::MtpGolden raw = test::load_mtp_golden(dir);
  Golden g;
  g.k = raw.k;
  g.sequences = std::move(raw.sequences);
  g.prompt_lengths = std::move(raw.prompt_lengths);
  EXPECT_EQ(raw.positions.size(), raw.margins.size());
  for (size_t r = 0; r < raw.positions.size() && r < raw.margins.size(); ++r) {
    const std::pair<int64_t, int64_t> at{raw.positions[r][0], raw.positions[r][1]};
    g.drafts[at] = std::vector<int64_t>(raw.positions[r].begin() + 2, raw.positions[r].end());
    g.margins[at] = raw.margins[r];
  }
  return g;
}

struct Rig {
  std::shared_ptr<const ModelWeights> weights;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Drafter> drafter;
};

// The engine and the drafter as afd generate --precision reference --speculative mtp makes them.
// Block size 4: the rolled-back drafts and the module's speculative positions cross blocks.
Rig make(const std::string& dir) {
  Rig s;
  auto w = load_model(dir);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  s.weights = *w;
  EngineOptions o;
  o.precision = Precision::reference;
  o.kv.capacity_tokens = 1024;
  o.kv.block_size = 4;
  o.kv.max_seqs = 8;
  o.speculative.method = SpeculativeMethod::mtp;
  o.speculative.draft_tokens = 3;
  EXPECT_TRUE(o.validate().is_ok());
  auto e = make_engine(o, s.weights);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  s.engine = std::move(*e);
  auto d = make_drafter(o, s.weights);
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  s.drafter = std::move(*d);
  EXPECT_TRUE(s.drafter && s.drafter->needs_hidden());
  return s;
}

// How one golden sequence is fed: chunks[0] positions in the first forward (the prompt), then
// chunks[1..] per step; a chunk of c positions after the first is one verification item
// [t, c - 1 accepted drafts] (+ one rejected draft when `reject`), settled with c - 1 accepted.
// The chunks sum to the sequence's length - 1: positions 0 .. len-2 are observed (the last
// token only ever follows as `next`). max_drafts(step) is what propose is asked for after the
// step's observation.
struct Plan {
  Plan() = default;
  explicit Plan(std::vector<int64_t> c, bool r = false) : chunks(std::move(c)), reject(r) {}
  std::vector<int64_t> chunks;
  bool reject = false;
  std::function<int64_t(size_t step)> max_drafts = [](size_t) { return int64_t{3}; };
};

// (sequence, position of the last observed token) -> the drafts proposed there.
using Drafts = std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>>;

// Replays every golden sequence in `plans` (by sequence index) at once: one forward and one
// propose call per step for all sequences that have chunks left.
Drafts replay(Rig& s, const Golden& g, const std::map<int64_t, Plan>& plans) {
  const int64_t H = s.weights->config.hidden_size, V = s.weights->config.vocab_size;
  struct Track {
    int64_t q = 0, seq = -1, observed = 0;
    const Plan* plan = nullptr;
    size_t step = 0;
    std::vector<int32_t> tokens;  // forwarded this step
  };
  std::vector<Track> tracks;
  for (const auto& [q, plan] : plans) {
    int64_t sum = 0;
    for (int64_t c : plan.chunks) sum += c;
    EXPECT_EQ(sum + 1, static_cast<int64_t>(g.sequences[q].size())) << "plan of sequence " << q;
    auto id = s.engine->create_sequence();
    EXPECT_TRUE(id.ok());
    EXPECT_TRUE(s.drafter->add_sequence(*id).is_ok());
    Track t;
    t.q = q;
    t.seq = *id;
    t.plan = &plan;
    tracks.push_back(std::move(t));
  }
  Drafts out;
  for (;;) {
    std::vector<BatchItem> items;
    std::vector<Track*> live;
    for (Track& t : tracks) {
      if (t.step >= t.plan->chunks.size()) continue;
      const std::vector<int32_t>& toks = g.sequences[t.q];
      const int64_t c = t.plan->chunks[t.step], pos = t.observed;
      t.tokens.assign(toks.begin() + pos, toks.begin() + pos + c);
      int64_t n_draft = 0;
      if (pos > 0) {
        n_draft = c - 1;
        if (t.plan->reject) {  // a draft that is not the next token
          t.tokens.push_back(static_cast<int32_t>((toks[pos + c] + 1) % V));
          ++n_draft;
        }
      }
      items.push_back(BatchItem{t.seq, t.tokens, /*all_logits=*/true, n_draft});
      live.push_back(&t);
    }
    if (live.empty()) break;
    std::vector<float> logits, hidden;
    Status st = s.engine->forward_with_hidden(items, &logits, &hidden);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    std::vector<Drafter::Query> queries;
    int64_t row = 0;
    for (size_t k = 0; k < live.size(); ++k) {
      Track& t = *live[k];
      const std::vector<int32_t>& toks = g.sequences[t.q];
      const int64_t c = t.plan->chunks[t.step], pos = t.observed;
      if (items[k].n_draft > 0) {
        EXPECT_TRUE(s.engine->settle_drafts(t.seq, c - 1).is_ok());
      }
      EXPECT_EQ(s.engine->sequence_length(t.seq), pos + c);
      st = s.drafter->observe(t.seq, pos, std::span<const float>(&hidden[row * H], static_cast<size_t>(c * H)),
                              std::span<const int32_t>(toks.data() + pos + 1, static_cast<size_t>(c)));
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      row += static_cast<int64_t>(t.tokens.size());
      t.observed = pos + c;
      queries.push_back(Drafter::Query{t.seq, std::span<const int32_t>(toks.data(), static_cast<size_t>(pos + c + 1)),
                                       t.plan->max_drafts(t.step)});
      ++t.step;
    }
    EXPECT_EQ(row * H, static_cast<int64_t>(hidden.size()));
    std::vector<std::vector<int32_t>> drafts;
    st = s.drafter->propose(queries, &drafts);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(drafts.size(), queries.size());
    for (size_t k = 0; k < live.size() && k < drafts.size(); ++k) {
      EXPECT_EQ(static_cast<int64_t>(drafts[k].size()), queries[k].max_drafts)
          << "sequence " << live[k]->q << " at " << live[k]->observed - 1;
      out[{live[k]->q, live[k]->observed - 1}] = drafts[k];
    }
  }
  for (Track& t : tracks) {
    s.drafter->release_sequence(t.seq);
    s.engine->release_sequence(t.seq);
  }
  EXPECT_EQ(s.engine->kv_usage().blocks_used, 0);
  return out;
}

struct Tally {
  int64_t drafts = 0, checked = 0, wrong = 0;
};

// Compares every proposed draft with the golden (margins above kMtpMinMargin).
Tally compare(const Golden& g, const Drafts& got) {
  Tally t;
  for (const auto& [at, drafts] : got) {
    auto want = g.drafts.find(at);
    EXPECT_NE(want, g.drafts.end()) << "no golden row for sequence " << at.first << " position " << at.second;
    if (want == g.drafts.end()) continue;
    const std::vector<double>& m = g.margins.at(at);
    EXPECT_LE(static_cast<int64_t>(drafts.size()), g.k);
    for (size_t j = 0; j < drafts.size() && j < want->second.size(); ++j) {
      ++t.drafts;
      if (m[j] <= kMtpMinMargin) break;
      ++t.checked;
      if (drafts[j] != want->second[j]) {
        ++t.wrong;
        ADD_FAILURE() << "sequence " << at.first << " position " << at.second << " draft " << j + 1 << ": " << drafts[j]
                      << ", the golden has " << want->second[j];
      }
    }
  }
  return t;
}

void expect_most_checked(const Tally& t, int64_t min_drafts) {
  EXPECT_GE(t.drafts, min_drafts);
  EXPECT_GE(t.checked * 10, t.drafts * 9) << t.checked << " of " << t.drafts << " drafts compared";
  EXPECT_EQ(t.wrong, 0);
}

std::vector<int64_t> ones_after(int64_t first, int64_t total) {
  std::vector<int64_t> c{first};
  for (int64_t n = first; n < total; ++n) c.push_back(1);
  return c;
}

// Chunks of 1..4 positions (k + 1 at most: every draft accepted) in a fixed irregular order.
std::vector<int64_t> mixed_chunks(int64_t first, int64_t total, size_t phase) {
  static const int64_t kSizes[] = {3, 1, 4, 2, 4, 1, 2, 3};
  std::vector<int64_t> c{first};
  for (int64_t n = first, i = 0; n < total; ++i) {
    const int64_t step = std::min(kSizes[(phase + static_cast<size_t>(i)) % 8], total - n);
    c.push_back(step);
    n += step;
  }
  return c;
}

class MtpDrafterGolden : public ::testing::TestWithParam<std::string> {};

// One token in the first forward, then one position per step: a proposal at every position the
// golden lists, each sequence alone.
TEST_P(MtpDrafterGolden, OnePositionPerStepDraftsTheGoldenAtEveryPosition) {
  Rig s = make(GetParam());
  const Golden g = load_golden(GetParam());
  ASSERT_EQ(g.k, 3);
  Drafts all;
  for (size_t q = 0; q < g.sequences.size(); ++q) {
    const int64_t n = static_cast<int64_t>(g.sequences[q].size()) - 1;
    const Drafts d = replay(s, g, {{static_cast<int64_t>(q), Plan{ones_after(1, n)}}});
    all.insert(d.begin(), d.end());
  }
  EXPECT_EQ(all.size(), g.drafts.size());  // every golden position
  expect_most_checked(compare(g, all), 100);
}

// As generate(): every sequence's prompt (the golden's prompt lengths) in one prefill, observed at
// once, then one position per step for all sequences in one batch and one propose call.
TEST_P(MtpDrafterGolden, AsGenerateFeedsItPromptThenOnePositionPerStep) {
  Rig s = make(GetParam());
  const Golden g = load_golden(GetParam());
  std::map<int64_t, Plan> plans;
  int64_t want_positions = 0;
  for (size_t q = 0; q < g.sequences.size(); ++q) {
    const int64_t n = static_cast<int64_t>(g.sequences[q].size()) - 1, p = g.prompt_lengths[q];
    ASSERT_GE(p, 1);
    ASSERT_LT(p, n);
    plans[static_cast<int64_t>(q)] = Plan{ones_after(p, n)};
    want_positions += n - p + 1;
  }
  const Drafts d = replay(s, g, plans);
  EXPECT_EQ(static_cast<int64_t>(d.size()), want_positions);
  expect_most_checked(compare(g, d), 3 * want_positions);
}

// Several positions per observe call (the accepted drafts of a verification, a rejected one rolled
// back in the engine), the sequences in one batch with other chunk sizes: the drafts at the
// chunks' ends are the golden's and those of one position per step.
TEST_P(MtpDrafterGolden, SeveralPositionsPerObserveDraftTheSame) {
  Rig s = make(GetParam());
  const Golden g = load_golden(GetParam());
  std::map<int64_t, Plan> plans, single;
  for (size_t q = 0; q < g.sequences.size(); ++q) {
    const int64_t n = static_cast<int64_t>(g.sequences[q].size()) - 1, p = g.prompt_lengths[q];
    plans[static_cast<int64_t>(q)] = Plan{mixed_chunks(p, n, q), /*reject=*/true};
    single[static_cast<int64_t>(q)] = Plan{ones_after(p, n)};
  }
  const Drafts several = replay(s, g, plans);
  const Drafts one = replay(s, g, single);
  EXPECT_GE(several.size(), 10u);
  expect_most_checked(compare(g, several), 30);
  for (const auto& [at, d] : several) {
    ASSERT_TRUE(one.count(at)) << at.first << " " << at.second;
    EXPECT_EQ(d, one.at(at)) << "sequence " << at.first << " position " << at.second;
  }
}

// Fewer drafts asked for at some steps (none at all at some: the observed positions still go
// through the module), every sequence in one propose call: each proposal is the golden's prefix.
TEST_P(MtpDrafterGolden, FewerDraftsAreThePrefixAndNoneKeepsTheModuleInStep) {
  Rig s = make(GetParam());
  const Golden g = load_golden(GetParam());
  std::map<int64_t, Plan> plans;
  for (size_t q = 0; q < g.sequences.size(); ++q) {
    const int64_t n = static_cast<int64_t>(g.sequences[q].size()) - 1, p = g.prompt_lengths[q];
    Plan plan{mixed_chunks(p, n, 3 * q + 1), /*reject=*/q % 2 == 0};
    plan.max_drafts = [q](size_t step) { return static_cast<int64_t>((step + q) % 4); };
    plans[static_cast<int64_t>(q)] = std::move(plan);
  }
  const Drafts d = replay(s, g, plans);
  int64_t none = 0, some = 0;
  for (const auto& [at, drafts] : d) (drafts.empty() ? none : some)++;
  EXPECT_GT(none, 0);
  EXPECT_GT(some, 5);
  expect_most_checked(compare(g, d), 15);
}

INSTANTIATE_TEST_SUITE_P(Golden, MtpDrafterGolden, ::testing::Values(kMtpOwnHead, kMtpSharedHead),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return std::string(info.param == kMtpOwnHead ? "OwnEmbeddingAndHead"
                                                                     : "SharedEmbeddingAndHead");
                         });

TEST(MtpDrafter, ObserveRefusesGapsSizesAndUnknownSequences) {
  Rig s = make(kMtpSharedHead);
  const Golden g = load_golden(kMtpSharedHead);
  const int64_t H = s.weights->config.hidden_size;
  const std::vector<int32_t>& toks = g.sequences[0];
  auto id = s.engine->create_sequence();
  ASSERT_TRUE(id.ok());
  BatchItem it{*id, std::span<const int32_t>(toks.data(), 4), true};
  std::vector<float> logits, hidden;
  ASSERT_TRUE(s.engine->forward_with_hidden({&it, 1}, &logits, &hidden).is_ok());
  const std::span<const int32_t> next(toks.data() + 1, 4);
  EXPECT_FALSE(s.drafter->observe(*id, 0, hidden, next).is_ok());  // not added
  ASSERT_TRUE(s.drafter->add_sequence(*id).is_ok());
  EXPECT_FALSE(s.drafter->add_sequence(*id).is_ok());              // twice
  EXPECT_FALSE(s.drafter->observe(*id, 1, hidden, next).is_ok());  // a gap
  EXPECT_FALSE(s.drafter->observe(*id, 0, std::span<const float>(hidden).first(3 * H), next).is_ok());
  ASSERT_TRUE(s.drafter->observe(*id, 0, std::span<const float>(hidden).first(2 * H), next.first(2)).is_ok());
  EXPECT_FALSE(s.drafter->observe(*id, 3, std::span<const float>(hidden).subspan(3 * H), next.subspan(3)).is_ok());
  ASSERT_TRUE(s.drafter->observe(*id, 2, std::span<const float>(hidden).subspan(2 * H), next.subspan(2)).is_ok());
  std::vector<std::vector<int32_t>> drafts;
  Drafter::Query q{*id, std::span<const int32_t>(toks.data(), 5), 3};
  ASSERT_TRUE(s.drafter->propose({&q, 1}, &drafts).is_ok());
  ASSERT_EQ(drafts.size(), 1u);
  const std::vector<int64_t>& want = g.drafts.at({0, 3});
  EXPECT_EQ(drafts[0], std::vector<int32_t>(want.begin(), want.end()));
  Drafter::Query unknown{*id + 100, q.context, 1};
  EXPECT_FALSE(s.drafter->propose({&unknown, 1}, &drafts).is_ok());
  s.drafter->release_sequence(*id);
  EXPECT_FALSE(s.drafter->observe(*id, 4, std::span<const float>(hidden).first(H), next.first(1)).is_ok());
  s.drafter->release_sequence(*id);  // twice: ignored
  s.engine->release_sequence(*id);
}

}  // namespace
}  // namespace afd
