// Structured outputs in the serving scheduler, on the trained default model: every answer of
// a request with a grammar is in the grammar's language (greedy and sampled, many seeds, so
// only the mask can make it true), ends when the grammar does (also under ignore_eos), and
// greedy answers are the same with speculative drafts (n-gram, MTP) as without, the drafts
// being cut where the grammar refuses them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../bytes_tokenizer.h"
#include "../fake_engine.h"
#include "default_model.h"
#include "model/weights.h"
#include "runtime/engine_factory.h"
#include "runtime/speculative.h"
#include "serve/scheduling/scheduler.h"
#include "serve/structured/gbnf_builder.h"
#include "serve/structured/grammar_cache.h"
#include "serve/text/tokenizer.h"

namespace afd::serve::test_scheduler_structured {
namespace {

std::shared_ptr<const ModelWeights> weights() { return testing::default_weights(); }
std::shared_ptr<const Tokenizer> tokenizer() { return testing::default_tokenizer(); }

constexpr int32_t kEos = 4091;  // <|eos|>

std::shared_ptr<GrammarCache> grammars() {
  static auto g = std::make_shared<GrammarCache>(TokenVocab::build(*tokenizer(), {kEos}, weights()->config.vocab_size));
  return g;
}

const char* kSchema = R"({"type": "object", "properties": {
  "word": {"type": "string", "minLength": 1, "maxLength": 10},
  "count": {"type": "integer", "minimum": 0, "maximum": 99},
  "kind": {"enum": ["noun", "verb", "adjective"]},
  "seen": {"type": "boolean"}},
  "required": ["word", "count", "kind", "seen"], "additionalProperties": false})";

bool valid(const std::string& text) {
  auto v = nlohmann::json::parse(text, nullptr, false);
  if (v.is_discarded() || !v.is_object() || v.size() != 4) return false;
  if (!v["word"].is_string() || v["word"].get<std::string>().empty()) return false;
  if (!v["count"].is_number_integer() || v["count"].get<int64_t>() < 0 || v["count"].get<int64_t>() > 99) return false;
  const std::string kind = v["kind"].is_string() ? v["kind"].get<std::string>() : "";
  return (kind == "noun" || kind == "verb" || kind == "adjective") && v["seen"].is_boolean();
}

struct Answer {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::none;
};

std::vector<Answer> serve(EngineOptions o, int n_requests, float temperature, bool ignore_eos) {
  std::vector<Answer> out(static_cast<size_t>(n_requests));
  auto e = make_engine(o, weights());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  auto d = make_drafter(o, weights(), e->get());
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  if (!e.ok() || !d.ok()) return out;
  SchedulerOptions so;
  so.max_batch_tokens = 16;
  so.draft_tokens = *d ? o.speculative.draft_tokens : 0;
  Metrics metrics(1);
  Scheduler sched(e->get(), so, &metrics.worker(0), &metrics, d->get());
  auto gbnf = json_schema_to_gbnf(nlohmann::ordered_json::parse(kSchema));
  EXPECT_TRUE(gbnf.ok()) << gbnf.status().to_string();
  auto grammar = grammars()->get(*gbnf);
  EXPECT_TRUE(grammar.ok()) << grammar.status().to_string();
  std::vector<std::shared_ptr<SeqRequest>> reqs;
  for (int i = 0; i < n_requests; ++i) {
    GenerationRequest g;
    auto ids = tokenizer()->encode("<|user|>Describe the word harbor.<|assistant|>", true);
    g.prompt = {4090};  // BOS
    g.prompt.insert(g.prompt.end(), ids->begin(), ids->end());
    g.max_tokens = 400;
    g.ignore_eos = ignore_eos;
    g.sampling.temperature = temperature;
    g.sampling.seed = 100 + i;
    g.format.kind = "json_schema";
    g.format.gbnf = *gbnf;
    g.format.grammar = *grammar;
    reqs.push_back(std::make_shared<SeqRequest>(g, tokenizer().get(), std::vector<int32_t>{kEos}, 0.0));
    EXPECT_TRUE(sched.submit(reqs.back()).is_ok());
  }
  for (int guard = 0; guard < 5000; ++guard) {
    auto n = sched.step();
    EXPECT_TRUE(n.ok()) << n.status().to_string();
    if (!n.ok() || *n == 0) break;
  }
  EXPECT_EQ(metrics.structured.requests.load(), n_requests);
  int64_t n_tokens = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (StreamEvent& ev : reqs[i]->channel->wait(std::chrono::milliseconds(0))) {
      n_tokens += static_cast<int64_t>(ev.tokens.size());
      for (const TokenInfo& t : ev.tokens) out[i].tokens.push_back(t.token);
      out[i].text += ev.text;
      if (ev.finish != FinishReason::none) {
        out[i].finish = ev.finish;
        EXPECT_TRUE(ev.error.is_ok()) << ev.error.to_string();
      }
    }
  }
  // One mask per sampled position: at least one per token (more with drafts).
  EXPECT_GE(metrics.structured.masks.load(), n_tokens);
  EXPECT_GT(metrics.structured.mask_ns.load(), 0);
  return out;
}

EngineOptions options() {
  EngineOptions o;
  o.precision = Precision::reference;
  o.n_threads = 2;
  o.kv.capacity_tokens = 8192;
  o.kv.block_size = 16;
  o.kv.max_seqs = 16;
  return o;
}

TEST(SchedulerStructured, EverySampledAnswerValidates) {
  ASSERT_TRUE(weights() && tokenizer());
  for (bool ignore_eos : {false, true}) {
    const auto answers = serve(options(), 12, 1.0f, ignore_eos);
    for (const Answer& a : answers) {
      EXPECT_EQ(a.finish, FinishReason::stop) << a.text;
      EXPECT_TRUE(valid(a.text)) << a.text;
    }
  }
}

TEST(SchedulerStructured, GreedyAnswersAreTheSameWithDrafts) {
  ASSERT_TRUE(weights() && tokenizer());
  const auto plain = serve(options(), 3, 0.0f, false);
  for (const Answer& a : plain) EXPECT_TRUE(valid(a.text)) << a.text;
  for (auto [method, k] : {std::pair{SpeculativeMethod::ngram, 4}, std::pair{SpeculativeMethod::mtp, 3}}) {
    EngineOptions o = options();
    o.speculative.method = method;
    o.speculative.draft_tokens = k;
    o.speculative.ngram_min = 1;
    const auto spec = serve(o, 3, 0.0f, false);
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(spec[i].tokens, plain[i].tokens) << speculative_method_name(method);
      EXPECT_EQ(spec[i].text, plain[i].text);
    }
  }
  // Sampled with drafts: still every answer in the language.
  EngineOptions o = options();
  o.speculative.method = SpeculativeMethod::ngram;
  o.speculative.draft_tokens = 4;
  o.speculative.ngram_min = 1;
  for (const Answer& a : serve(o, 6, 1.0f, false)) EXPECT_TRUE(valid(a.text)) << a.text;
}

// A grammar that allows nothing more, on a vocabulary without end tokens: the answer ends
// with stop at that step (no token sampled), under ignore_eos too, whatever the engine prefers.
TEST(SchedulerStructured, AnswerEndsWhenTheGrammarAllowsNothingMore) {
  auto tok = testing::bytes_tokenizer();
  testing::FakeEngine engine(257, 4096, 1000, 4);
  Metrics metrics(1);
  Scheduler sched(&engine, {}, &metrics.worker(0), &metrics);
  GrammarCache cache(TokenVocab::build(*tok, {}, 257));
  auto grammar = cache.get("root ::= \"ab\" | \"abc\"");
  ASSERT_TRUE(grammar.ok()) << grammar.status().to_string();
  for (bool ignore_eos : {false, true}) {
    GenerationRequest g;
    g.prompt = {'x', 'y'};
    g.max_tokens = 50;
    g.ignore_eos = ignore_eos;
    g.format.kind = "guided_grammar";
    g.format.grammar = *grammar;
    auto r = std::make_shared<SeqRequest>(g, tok.get(), std::vector<int32_t>{}, 0.0);
    ASSERT_TRUE(sched.submit(r).is_ok());
    for (int i = 0; i < 100 && sched.step().ok() && r->seq_id >= 0; ++i) {
    }
    std::string text;
    FinishReason fin = FinishReason::none;
    int64_t n = 0;
    for (StreamEvent& ev : r->channel->wait(std::chrono::milliseconds(0))) {
      text += ev.text;
      n += static_cast<int64_t>(ev.tokens.size());
      if (ev.finish != FinishReason::none) fin = ev.finish;
    }
    EXPECT_EQ(fin, FinishReason::stop);
    EXPECT_EQ(text, "abc");  // without end tokens "ab" cannot end: only 'c' may follow it
    EXPECT_EQ(n, static_cast<int64_t>(text.size()));
  }
}

}  // namespace
}  // namespace afd::serve::test_scheduler_structured
