// Speculative decoding in the serving scheduler, on the trained default model: greedy
// requests batched together — some in prefill chunks while others verify drafts in the same
// forward pass — produce the same tokens with n-gram or MTP drafts as without, in reference
// precision and in fast precision with --deterministic, in mono and AFD wirings; sampled
// requests with drafts finish with every token they asked for; /metrics counts the drafts.
#include <gtest/gtest.h>

#include "default_model.h"
#include "model/weights.h"
#include "runtime/engine_factory.h"
#include "runtime/speculative.h"
#include "serve/scheduling/scheduler.h"
#include "serve/text/tokenizer.h"

namespace afd::serve::test_scheduler_speculative {
namespace {

std::shared_ptr<const ModelWeights> weights() { return testing::default_weights(); }
std::shared_ptr<const Tokenizer> tokenizer() { return testing::default_tokenizer(); }

struct Served {
  std::vector<std::vector<int32_t>> tokens;  // per request
  std::vector<FinishReason> finish;
  int64_t verifications = 0, drafted = 0, accepted = 0;
  std::string metrics;  // the /metrics text after the run
};

// Serves `prompts` (token ids) through one scheduler, driven step by step, and collects the tokens.
Served serve(EngineOptions o, const std::vector<std::vector<int32_t>>& prompts, float temperature) {
  Served run;
  auto e = make_engine(o, weights());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return run;
  auto d = make_drafter(o, weights(), e->get());
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  if (!d.ok()) return run;
  SchedulerOptions so;
  so.max_batch_tokens = 12;  // long prompts go in chunks beside the others' verification items
  so.draft_tokens = *d ? o.speculative.draft_tokens : 0;
  so.draft_max_batch = o.speculative.max_batch;
  Metrics metrics(1);
  Scheduler sched(e->get(), so, &metrics.worker(0), &metrics, d->get());
  std::vector<std::shared_ptr<SeqRequest>> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest g;
    g.prompt = prompts[i];
    g.max_tokens = 10 + 3 * static_cast<int64_t>(i);
    g.ignore_eos = true;
    g.sampling.temperature = temperature;
    g.sampling.seed = 7 + i;
    reqs.push_back(std::make_shared<SeqRequest>(g, tokenizer().get(), std::vector<int32_t>{}, 0.0));
    EXPECT_TRUE(sched.submit(reqs.back()).is_ok());
  }
  run.tokens.resize(reqs.size());
  run.finish.assign(reqs.size(), FinishReason::none);
  for (int guard = 0; guard < 1000; ++guard) {
    auto n = sched.step();
    EXPECT_TRUE(n.ok()) << n.status().to_string();
    if (!n.ok() || *n == 0) break;
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (StreamEvent& ev : reqs[i]->channel->wait(std::chrono::milliseconds(0))) {
      for (const TokenInfo& t : ev.tokens) run.tokens[i].push_back(t.token);
      if (ev.finish != FinishReason::none) {
        run.finish[i] = ev.finish;
        EXPECT_TRUE(ev.error.is_ok()) << ev.error.to_string();
      }
    }
  }
  run.verifications = metrics.speculative.verifications.load();
  run.drafted = metrics.speculative.draft_tokens.load();
  run.accepted = metrics.speculative.accepted_tokens.load();
  run.metrics = metrics.render();
  return run;
}

std::vector<std::vector<int32_t>> prompts() {
  auto tok = tokenizer();
  std::vector<std::vector<int32_t>> p;
  for (const char* text : {"The old man walked", "A small piece of cloth used to make a pitch. A small piece of",
                           "harbor: a place where ships", "the act of moving something from one place to another place",
                           // Text, then its start again: the model goes on copying it (a definition
                           // from the text), so the n-gram drafter's matches get accepted.
                           "conquest (noun): success in mastering something difficult. Example: the conquest of space. "
                           "bobble (noun): the momentary juggling of a batted or thrown baseball.\n\nconquest (n"}) {
    std::vector<int32_t> ids = {4090};  // BOS
    auto enc = tok->encode(text, false);
    EXPECT_TRUE(enc.ok()) << enc.status().to_string();
    if (enc.ok()) ids.insert(ids.end(), enc->begin(), enc->end());
    p.push_back(std::move(ids));
  }
  return p;
}

EngineOptions options(const std::string& topology, Precision prec, bool deterministic) {
  EngineOptions o;
  o.precision = prec;
  o.deterministic = deterministic;
  o.n_threads = 2;
  o.topology = *parse_topology(topology);
  o.kv.capacity_tokens = 2048;
  o.kv.block_size = 4;
  o.kv.max_seqs = 8;
  return o;
}

TEST(SchedulerSpeculative, GreedyTokensEqualThoseWithoutDrafts) {
  ASSERT_TRUE(weights() && tokenizer());
  const auto p = prompts();
  struct Numerics {
    Precision prec;
    bool det;
  };
  for (Numerics nu : {Numerics{Precision::reference, false}, Numerics{Precision::fast, true}}) {
    for (const char* topo : {"mono", "1A1F", "2A1F"}) {
      const EngineOptions base = options(topo, nu.prec, nu.det);
      const Served plain = serve(base, p, 0.0f);
      for (auto [method, k] : {std::pair{SpeculativeMethod::ngram, 4}, std::pair{SpeculativeMethod::mtp, 3}}) {
        EngineOptions o = base;
        o.speculative.method = method;
        o.speculative.draft_tokens = k;
        o.speculative.ngram_min = 1;  // short outputs: propose on any repeated token
        const Served spec = serve(o, p, 0.0f);
        const std::string what = std::string(speculative_method_name(method)) + " " + precision_name(nu.prec) +
                                 (nu.det ? " deterministic " : " ") + topo;
        EXPECT_EQ(plain.tokens, spec.tokens) << what;
        for (size_t i = 0; i < p.size(); ++i) {
          EXPECT_EQ(spec.finish[i], FinishReason::length) << what;
          EXPECT_EQ(static_cast<int64_t>(spec.tokens[i].size()), 10 + 3 * static_cast<int64_t>(i)) << what;
        }
        EXPECT_GT(spec.verifications, 0) << what;
        EXPECT_GT(spec.accepted, 0) << what;  // n-gram: on the copying prompt's output
        EXPECT_LE(spec.accepted, spec.drafted) << what;
        EXPECT_EQ(plain.verifications, 0) << what;
      }
    }
  }
}

// --speculative-max-batch auto: the governor drafts in some steps and not in others (it tries
// both sides first); the greedy tokens stay those without drafts.
TEST(SchedulerSpeculative, AutoMaxBatchKeepsTheGreedyTokens) {
  ASSERT_TRUE(weights() && tokenizer());
  const auto p = prompts();
  const EngineOptions base = options("mono", Precision::reference, false);
  const Served plain = serve(base, p, 0.0f);
  EngineOptions o = base;
  o.speculative.method = SpeculativeMethod::ngram;
  o.speculative.draft_tokens = 4;
  o.speculative.ngram_min = 1;
  o.speculative.max_batch = SpeculativeOptions::kMaxBatchAuto;
  const Served spec = serve(o, p, 0.0f);
  EXPECT_EQ(plain.tokens, spec.tokens);
  EXPECT_GT(spec.verifications, 0);
  EXPECT_GT(spec.accepted, 0);
  // /metrics shows the governor: a gauge per batch-size bucket, and rates of both sides (every
  // bucket warms up trying both, and the decode steps outnumber the buckets, so some bucket
  // measured both; which one, and which side it then prefers, depends on the timing).
  EXPECT_NE(spec.metrics.find("afd_spec_decode_auto_drafts{worker=\"0\",batch=\"65+\"} "), std::string::npos);
  auto any_rate = [&](const std::string& side) {
    const std::string key = "drafts=\"" + side + "\"} ";
    for (size_t at = spec.metrics.find(key); at != std::string::npos; at = spec.metrics.find(key, at + 1))
      if (std::stod(spec.metrics.substr(at + key.size())) > 0) return true;
    return false;
  };
  EXPECT_TRUE(any_rate("on")) << spec.metrics;
  EXPECT_TRUE(any_rate("off")) << spec.metrics;
  EXPECT_EQ(plain.metrics.find("afd_spec_decode_auto"), std::string::npos);
}

TEST(SchedulerSpeculative, SampledRequestsWithDraftsFinish) {
  ASSERT_TRUE(weights() && tokenizer());
  EngineOptions o = options("mono", Precision::fast, false);
  o.speculative.method = SpeculativeMethod::mtp;
  o.speculative.draft_tokens = 2;
  const auto p = prompts();
  const Served a = serve(o, p, 0.8f);
  const Served b = serve(o, p, 0.8f);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(a.finish[i], FinishReason::length);
    EXPECT_EQ(static_cast<int64_t>(a.tokens[i].size()), 10 + 3 * static_cast<int64_t>(i));
    for (int32_t t : a.tokens[i]) EXPECT_TRUE(t >= 0 && t < 4096);
  }
  EXPECT_EQ(a.tokens, b.tokens);  // seeded: reproducible with the same drafts
  EXPECT_GT(a.verifications, 0);
}

}  // namespace
}  // namespace afd::serve::test_scheduler_speculative
