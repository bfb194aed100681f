// Speculative decoding (runtime/speculative.h): the n-gram drafter's lookup, the rejection
// rule's output distribution, draft settlement in the KV cache and the prefix cache, and the
// end-to-end property: greedy output with speculation equals greedy output without it, token
// for token, on the trained default model (n-gram and MTP drafts) and the families' tiny
// checkpoints, in every wiring, with --deterministic in fast and reference precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "../model/model_test_util.h"
#include "model/tools/make_model.h"
#include "model/weights.h"
#include "runtime/engine_factory.h"
#include "runtime/generate.h"
#include "runtime/speculative.h"

namespace afd::test_speculative {
namespace {

TEST(Ngram, ProposesTheContinuationOfTheLatestLongestMatch) {
  NgramDrafter d(2, 4);
  // "1 2 3 | 9 ... 1 2 3 | 7 8 ... 1 2 3": the latest earlier match of "1 2 3" is followed by 7 8.
  std::vector<int32_t> ctx = {1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 6, 1, 2, 3};
  EXPECT_EQ(d.lookup(ctx, 2), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(d.lookup(ctx, 5), (std::vector<int32_t>{7, 8, 6, 1, 2}));
  // A longer n-gram wins over a later shorter one: "4 1 2" matches at the start only.
  std::vector<int32_t> ctx2 = {4, 1, 2, 11, 12, 9, 1, 2, 13, 4, 1, 2};
  EXPECT_EQ(d.lookup(ctx2, 2), (std::vector<int32_t>{11, 12}));
  // The continuation stops at the context's end.
  std::vector<int32_t> ctx3 = {5, 6, 5, 6};
  EXPECT_EQ(d.lookup(ctx3, 8), (std::vector<int32_t>{5, 6}));
  // No match of length >= 2: no drafts; max_drafts 0: none.
  std::vector<int32_t> ctx4 = {1, 2, 3, 4, 5, 3};
  EXPECT_TRUE(d.lookup(ctx4, 3).empty());
  EXPECT_TRUE(d.lookup(ctx, 0).empty());
}

TEST(Verify, GreedyAcceptsExactlyTheArgmax) {
  const float row[] = {0.1f, 2.0f, 1.0f, -1.0f};
  Sampler s(SamplingParams{});
  bool acc = false;
  EXPECT_EQ(s.verify(row, 4, 1, &acc).token, 1);
  EXPECT_TRUE(acc);
  EXPECT_EQ(s.verify(row, 4, 2, &acc).token, 1);
  EXPECT_FALSE(acc);
  EXPECT_EQ(s.draws(), 0u);
  // verify_drafts: rows after the first rejection are not read.
  std::vector<float> rows = {0, 5, 0, 0,  /* */ 0, 0, 5, 0,  /* */ 5, 0, 0, 0,  /* */ 0, 0, 0, 5};
  std::vector<int32_t> drafts = {1, 2, 3};
  auto out = verify_drafts(s, rows.data(), 4, drafts);
  ASSERT_EQ(out.size(), 3u);  // 1, 2 accepted; 3 rejected for 0
  EXPECT_EQ(out[0].token, 1);
  EXPECT_EQ(out[1].token, 2);
  EXPECT_EQ(out[2].token, 0);
  drafts = {1, 2, 0};
  out = verify_drafts(s, rows.data(), 4, drafts);
  ASSERT_EQ(out.size(), 4u);  // all accepted, then the bonus token from the last row
  EXPECT_EQ(out[3].token, 3);
}

// Pearson chi-square of observed counts against probabilities p (cells with p > 0).
double chi_square(const std::vector<int64_t>& count, const std::vector<double>& p, int64_t n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(count[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = p[i] * static_cast<double>(n);
    x2 += (count[i] - e) * (count[i] - e) / e;
  }
  return x2;
}

// The distribution sample() draws from: softmax(logits / T) cut by top-k and top-p.
std::vector<double> target(const std::vector<float>& logits, const SamplingParams& sp) {
  const size_t V = logits.size();
  std::vector<size_t> idx(V);
  for (size_t i = 0; i < V; ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  size_t k = sp.top_k > 0 ? std::min<size_t>(V, static_cast<size_t>(sp.top_k)) : V;
  std::vector<double> q(k);
  double z = 0;
  for (size_t i = 0; i < k; ++i) z += q[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / sp.temperature);
  size_t keep = k;
  double acc = 0;
  for (size_t i = 0; i < k && sp.top_p < 1; ++i) {
    acc += q[i] / z;
    if (acc >= sp.top_p) { keep = i + 1; break; }
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += q[i];
  std::vector<double> p(V, 0.0);
  for (size_t i = 0; i < keep; ++i) p[idx[i]] = q[i] / mass;
  return p;
}

TEST(Verify, RejectionSamplingKeepsTheTargetDistribution) {
  // Seeded, so the result is fixed; the threshold is chi-square's 0.9999 quantile at the
  // cells' degrees of freedom (<= 7: 29.9), so a correct rule passes with margin while one that
  // favours or drops the draft (always accepting, or resampling without removing it) is off by
  // thousands.
  const std::vector<float> logits = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.0f, 2.2f};
  struct Case {
    float temperature, top_p;
    int64_t top_k;
    int32_t draft;
  };
  const Case cases[] = {{1.0f, 1.0f, 0, 1}, {1.0f, 1.0f, 0, 4}, {0.7f, 1.0f, 3, 3}, {1.3f, 0.8f, 0, 5},
                        {1.0f, 1.0f, 3, 6} /* the draft is outside the top-k: never accepted */};
  const int64_t n = 40000;
  for (const Case& c : cases) {
    SamplingParams sp;
    sp.temperature = c.temperature;
    sp.top_p = c.top_p;
    sp.top_k = c.top_k;
    sp.seed = 1234;
    Sampler s(sp);
    std::vector<int64_t> count(logits.size(), 0);
    int64_t accepted = 0;
    for (int64_t i = 0; i < n; ++i) {
      bool acc = false;
      ++count[static_cast<size_t>(s.verify(logits.data(), static_cast<int64_t>(logits.size()), c.draft, &acc).token)];
      accepted += acc;
    }
    const std::vector<double> p = target(logits, sp);
    EXPECT_LT(chi_square(count, p, n), 29.9) << "T=" << c.temperature << " top_p=" << c.top_p << " top_k=" << c.top_k
                                            << " draft=" << c.draft;
    // The acceptance rate is p(draft).
    EXPECT_NEAR(static_cast<double>(accepted) / n, p[static_cast<size_t>(c.draft)], 0.01);
  }
}

std::shared_ptr<const ModelWeights> tiny(Arch arch) {
  static std::map<int, std::shared_ptr<const ModelWeights>> cache;
  if (auto it = cache.find(static_cast<int>(arch)); it != cache.end()) return it->second;
  auto c = make_preset_config(arch, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return nullptr;
  MakeModelOptions o;
  o.out_dir = test::process_scratch_dir(std::string("afd_spec_") + arch_name(arch));
  o.seed = 5;
  auto r = make_model(*c, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  auto w = load_model(o.out_dir);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return cache[static_cast<int>(arch)] = w.ok() ? *w : nullptr;
}

std::shared_ptr<const ModelWeights> trained() {
  static std::shared_ptr<const ModelWeights> w = [] {
    auto r = load_model(AFD_SOURCE_DIR "/assets/models/wordnet-dsv3");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : nullptr;
  }();
  return w;
}

EngineOptions options(const std::string& topology, Precision prec, bool deterministic, int microbatches = 0,
                      int ffn_tp = 1) {
  EngineOptions o;
  o.precision = prec;
  o.deterministic = deterministic;
  o.n_threads = 2;
  o.topology = *parse_topology(topology);
  o.microbatches = microbatches;
  o.afd.ffn_tp = ffn_tp;
  o.kv.capacity_tokens = 4096;
  o.kv.block_size = 4;  // small blocks: drafts cross block boundaries and fill blocks
  o.kv.max_seqs = 8;
  return o;
}

TEST(SettleDrafts, KeepsTheAcceptedKvAndTheirPrefixCacheKeys) {
  auto w = tiny(Arch::qwen3_moe);
  ASSERT_TRUE(w);
  EngineOptions o = options("mono", Precision::fast, true);
  auto e = make_engine(o, w);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& eng = **e;
  const int64_t V = w->config.vocab_size;
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65};
  const std::vector<int32_t> step = {35, 89, 79, 32, 38};  // last token + 4 drafts
  // A: prompt, then [35, d1..d4] keeping 2 drafts, then [7]: its logits.
  auto a = *eng.create_sequence();
  std::vector<float> la, lb;
  ASSERT_TRUE(eng.forward(std::vector<BatchItem>{{a, prompt}}, &la).is_ok());
  EXPECT_FALSE(eng.settle_drafts(a, 0).is_ok());  // nothing to settle
  BatchItem bad{a, step, true, 5};
  EXPECT_FALSE(eng.forward(std::vector<BatchItem>{bad}, &la).is_ok());  // n_draft must be < tokens
  ASSERT_TRUE(eng.forward(std::vector<BatchItem>{{a, step, true, 4}}, &la).is_ok());
  EXPECT_EQ(eng.sequence_length(a), 10);
  const std::vector<int32_t> next = {7};
  EXPECT_FALSE(eng.forward(std::vector<BatchItem>{{a, next}}, &la).is_ok());  // unsettled drafts
  EXPECT_FALSE(eng.settle_drafts(a, 5).is_ok());
  ASSERT_TRUE(eng.settle_drafts(a, 2).is_ok());
  EXPECT_EQ(eng.sequence_length(a), 8);
  ASSERT_TRUE(eng.forward(std::vector<BatchItem>{{a, next}}, &la).is_ok());
  // B: the same tokens forwarded without drafts.
  auto b = *eng.create_sequence();
  ASSERT_TRUE(eng.forward(std::vector<BatchItem>{{b, prompt}}, &lb).is_ok());
  for (int32_t t : {35, 89, 79, 7}) ASSERT_TRUE(eng.forward(std::vector<BatchItem>{{b, std::vector<int32_t>{t}}}, &lb).is_ok());
  ASSERT_EQ(la.size(), static_cast<size_t>(V));
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4)) << "the kept drafts' KV differs from decoding them";
  eng.release_sequence(a);
  eng.release_sequence(b);
  // The prefix cache holds the accepted tokens' blocks and none of the rejected ones.
  std::vector<int32_t> kept = prompt;
  kept.insert(kept.end(), {35, 89, 79, 7, 1});
  EXPECT_EQ(eng.cached_prefix(kept), 8);
  std::vector<int32_t> rejected = prompt;
  rejected.insert(rejected.end(), {35, 89, 79, 32, 38, 1});
  EXPECT_EQ(eng.cached_prefix(rejected), 8);  // blocks [0,4) [4,8) are 3 14 15 92 | 65 35 89 79
  std::vector<int32_t> wrong = {3, 14, 15, 92, 65, 35, 89, 32, 38, 1};
  EXPECT_EQ(eng.cached_prefix(wrong), 4);
}

// Greedy tokens of generate() over a batch of prompts.
std::vector<std::vector<int32_t>> greedy(std::shared_ptr<const ModelWeights> w, const EngineOptions& o,
                                         const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
                                         SpeculativeStats* stats = nullptr) {
  auto e = make_engine(o, w);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  auto d = make_drafter(o, w, e->get());
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  if (!d.ok()) return {};
  GenerateOptions g;
  g.max_new_tokens = max_new;
  g.stop_at_eos = false;
  g.drafter = d->get();
  g.draft_tokens = *d ? o.speculative.draft_tokens : 0;
  auto r = generate(**e, prompts, g);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  if (stats) *stats = r->speculative;
  return r->tokens;
}

// Where greedy speculation must equal plain greedy: reference precision with and without
// --deterministic, fast precision with it (without it, fast MLA prefill and decode round
// differently, so a verified row can differ from the decoded one).
struct Numerics {
  Precision prec;
  bool deterministic;
};
const Numerics kNumerics[] = {{Precision::reference, false}, {Precision::reference, true}, {Precision::fast, true}};
std::string describe(const Numerics& n) {
  return std::string(precision_name(n.prec)) + (n.deterministic ? " deterministic" : "");
}

struct Wiring {
  std::string topology;
  int microbatches = 0;
  int ffn_tp = 1;
};
const Wiring kWirings[] = {{"mono"}, {"1A1F", 1}, {"1A1F", 3}, {"2A1F", 2}, {"1A2F", 2}, {"1A2F", 2, 2}, {"EP2"}};

void expect_speculation_exact(std::shared_ptr<const ModelWeights> w, SpeculativeMethod method, int64_t k,
                              const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
                              bool expect_accepts) {
  for (const Numerics& nu : kNumerics) {
    for (const Wiring& wr : kWirings) {
      EngineOptions o = options(wr.topology, nu.prec, nu.deterministic, wr.microbatches, wr.ffn_tp);
      const auto plain = greedy(w, o, prompts, max_new);
      o.speculative.method = method;
      o.speculative.draft_tokens = k;
      SpeculativeStats st;
      const auto spec = greedy(w, o, prompts, max_new, &st);
      const std::string what = std::string(speculative_method_name(method)) + " k=" + std::to_string(k) + " " +
                               describe(nu) + " " + wr.topology + " mb=" + std::to_string(wr.microbatches) +
                               " tp=" + std::to_string(wr.ffn_tp);
      EXPECT_EQ(plain, spec) << what;
      EXPECT_GT(st.drafts_proposed, 0) << what;
      if (expect_accepts) {
        EXPECT_GT(st.drafts_accepted, 0) << what;
      }
    }
  }
}

std::vector<std::vector<int32_t>> trained_prompts() {
  // BOS + a few words' token ids of the default model, with a repeated phrase for the n-gram drafter.
  return {{4090, 100, 200, 300, 400, 500, 600, 700},
          {4090, 121, 284, 306, 293, 258, 121, 284, 306},
          {4090, 258, 776, 1992, 2620, 308, 258, 776}};
}

TEST(Speculative, MtpGreedyEqualsPlainGreedyOnTheTrainedModel) {
  auto w = trained();
  ASSERT_TRUE(w);
  for (int64_t k : {1, 3}) expect_speculation_exact(w, SpeculativeMethod::mtp, k, trained_prompts(), 24, true);
}

TEST(Speculative, NgramGreedyEqualsPlainGreedyOnTheTrainedModel) {
  auto w = trained();
  ASSERT_TRUE(w);
  expect_speculation_exact(w, SpeculativeMethod::ngram, 4, trained_prompts(), 24, true);
}

// Proposes the known greedy continuation of each prompt (matched by its first tokens), with
// every `corrupt`-th draft replaced by a wrong token: verification then sees runs of accepted
// drafts, rejections at every draft position and full acceptance.
class ScriptedDrafter : public Drafter {
 public:
  ScriptedDrafter(std::vector<std::vector<int32_t>> full, int64_t vocab, int corrupt)
      : full_(std::move(full)), vocab_(vocab), corrupt_(corrupt) {}
  Status propose(std::span<const Query> queries, std::vector<std::vector<int32_t>>* drafts) override {
    drafts->assign(queries.size(), {});
    for (size_t i = 0; i < queries.size(); ++i) {
      for (const auto& f : full_) {
        const auto& ctx = queries[i].context;
        if (f.size() < ctx.size() || !std::equal(ctx.begin(), ctx.end(), f.begin())) continue;
        for (size_t j = ctx.size(); j < f.size() && static_cast<int64_t>((*drafts)[i].size()) < queries[i].max_drafts; ++j) {
          const bool bad = ++n_ % corrupt_ == 0;
          (*drafts)[i].push_back(bad ? static_cast<int32_t>((f[j] + 1) % vocab_) : f[j]);
        }
        break;
      }
    }
    return Status();
  }

 private:
  std::vector<std::vector<int32_t>> full_;  // prompt + greedy continuation
  int64_t vocab_;
  int corrupt_;
  int64_t n_ = 0;
};

TEST(Speculative, VerifiedDraftsGiveThePlainGreedyTokensOnEveryFamily) {
  // Random weights propose nothing useful, so the drafts come from the plain run's own
  // continuation with some corrupted: every acceptance pattern occurs.
  for (Arch arch : {Arch::qwen3_moe, Arch::deepseek_v3, Arch::step3_text}) {
    auto w = tiny(arch);
    ASSERT_TRUE(w);
    const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7, 8, 9, 5, 6, 7}, {11, 12, 13, 11, 12}, {40}};
    for (const Numerics& nu : kNumerics) {
      for (const Wiring& wr : kWirings) {
        EngineOptions o = options(wr.topology, nu.prec, nu.deterministic, wr.microbatches, wr.ffn_tp);
        const auto plain = greedy(w, o, prompts, 14);
        ASSERT_EQ(plain.size(), prompts.size());
        std::vector<std::vector<int32_t>> full;
        for (size_t i = 0; i < prompts.size(); ++i) {
          full.push_back(prompts[i]);
          full.back().insert(full.back().end(), plain[i].begin(), plain[i].end());
        }
        for (int corrupt : {3, 1000}) {
          ScriptedDrafter d(full, w->config.vocab_size, corrupt);
          auto e = make_engine(o, w);
          ASSERT_TRUE(e.ok()) << e.status().to_string();
          GenerateOptions g;
          g.max_new_tokens = 14;
          g.stop_at_eos = false;
          g.drafter = &d;
          g.draft_tokens = 4;
          auto r = generate(**e, prompts, g);
          ASSERT_TRUE(r.ok()) << r.status().to_string();
          const std::string what = std::string(arch_name(arch)) + " " + describe(nu) + " " + wr.topology +
                                   " mb=" + std::to_string(wr.microbatches) + " tp=" + std::to_string(wr.ffn_tp) +
                                   " corrupt=" + std::to_string(corrupt);
          EXPECT_EQ(r->tokens, plain) << what;
          EXPECT_GT(r->speculative.drafts_accepted, 0) << what;
          if (corrupt == 3) {
            EXPECT_LT(r->speculative.drafts_accepted, r->speculative.drafts_proposed) << what;
          } else {
            EXPECT_EQ(r->speculative.drafts_accepted, r->speculative.drafts_proposed) << what;
          }
        }
      }
    }
  }
}

TEST(Speculative, MtpRefusesAModelWithoutMtpLayers) {
  auto w = tiny(Arch::qwen3_moe);
  ASSERT_TRUE(w);
  EngineOptions o = options("mono", Precision::fast, false);
  o.speculative.method = SpeculativeMethod::mtp;
  auto d = make_drafter(o, w);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().to_string().find("no MTP module"), std::string::npos) << d.status().to_string();
  o.speculative.draft_tokens = 4;
  EXPECT_FALSE(o.validate().is_ok());
  o.speculative.method = SpeculativeMethod::ngram;
  EXPECT_TRUE(o.validate().is_ok());
  o.speculative.draft_tokens = 9;
  EXPECT_FALSE(o.validate().is_ok());
  o.speculative.draft_tokens = 0;
  EXPECT_FALSE(o.validate().is_ok());
}

}  // namespace
}  // namespace afd::test_speculative
