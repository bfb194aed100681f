// Attention-worker failover, the resume state machine without HTTP: the front end's record
// of an answer (ProxyOutput) and a worker's continuation (parse_internal_request,
// apply_resume, Scheduler over a FakeEngine). A request cut after any number of events and
// continued on a fresh worker gives the client exactly the bytes of an unfaulted run.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../bytes_tokenizer.h"
#include "../fake_engine.h"
#include "serve/api/internal_request.h"
#include "serve/api/internal_stream.h"
#include "serve/frontend/proxy_output.h"
#include "serve/scheduling/scheduler.h"
#include "serve/scheduling/worker_resume.h"
#include "serve/structured/grammar_cache.h"
#include "serve/text/unicode.h"

namespace afd::serve::test_resume {
namespace {

using testing::FakeEngine;
constexpr int64_t kVocab = 257;

using testing::bytes_tokenizer;

RequestLimits limits() {
  RequestLimits l;
  l.model_name = "m";
  l.vocab_size = kVocab;
  l.max_context = 4096;
  return l;
}

// One attention worker's serving path for internal requests, minus HTTP.
struct Worker {
  explicit Worker(std::shared_ptr<const Tokenizer> t) : tok(std::move(t)) {}
  // The events a request produces, as the front end decodes them off the wire; empty with
  // *err set when the worker refuses the request.
  std::vector<StreamEvent> run(const std::string& raw, Status* err = nullptr) {
    auto b = split_internal_body(raw);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    auto g = parse_internal_request(Endpoint::completions, *b, *tok, nullptr, limits());
    if (!g.ok()) {
      if (err) *err = g.status();
      return {};
    }
    if (!g->format.gbnf.empty()) {  // as the API does on its admission lane
      auto compiled = grammars.get(g->format.gbnf);
      EXPECT_TRUE(compiled.ok()) << compiled.status().to_string();
      g->format.grammar = *compiled;
    }
    auto r = std::make_shared<SeqRequest>(*g, tok.get(), std::vector<int32_t>{256}, 0.0);
    if (Status s = apply_resume(b->control, r.get()); !s.is_ok()) {
      if (err) *err = s;
      return {};
    }
    EXPECT_TRUE(sched.submit(r).is_ok());
    std::vector<StreamEvent> out;
    for (int i = 0; i < 10000; ++i) {
      EXPECT_TRUE(sched.step().ok());
      for (StreamEvent& e : r->channel->wait(std::chrono::milliseconds(0))) {
        const std::string wire = encode_event(e);
        auto d = decode_event(std::string_view(wire).substr(6, wire.size() - 8));
        EXPECT_TRUE(d.ok()) << d.status().to_string();
        out.push_back(d->event);
        if (e.finish != FinishReason::none) return out;
      }
    }
    ADD_FAILURE() << "the request never finished";
    return out;
  }
  std::shared_ptr<const Tokenizer> tok;
  GrammarCache grammars{TokenVocab::build(*tok, {256}, kVocab)};
  FakeEngine engine{kVocab, 4096, 1000, 4};
  Metrics metrics{1};
  Scheduler sched{&engine, {}, &metrics.worker(0), &metrics};
};

struct Answer {
  std::string bytes;  // streaming: the SSE body; otherwise the JSON body
  std::vector<int32_t> tokens;
};

// The front end's side: feeds events into `o` and returns the client's bytes so far.
std::string feed(ProxyOutput& o, const std::vector<StreamEvent>& evs, size_t from, size_t to) {
  std::string s;
  for (size_t i = from; i < to; ++i) s += o.add(evs[i]);
  return s;
}

void expect_every_cut_continues_exactly(const std::string& body, bool replay_exact = true,
                                       Endpoint ep = Endpoint::completions) {
  auto tok = bytes_tokenizer();
  auto g = parse_request(ep, body, *tok, nullptr, limits(), 12345);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ResponseMeta meta{"cmpl-1", "m", 1700000000, ep, g->logprobs, ""};
  ProxyOutput ref(meta, tok.get(), *g);
  Worker w0(tok);
  const std::vector<StreamEvent> evs = w0.run(encode_control(ref.control(1000)) + "\n" + body);
  ASSERT_FALSE(evs.empty());
  std::string want = feed(ref, evs, 0, evs.size());
  ASSERT_TRUE(ref.finished());
  if (!g->stream) want = ref.body();
  for (size_t k = 0; k < evs.size(); ++k) {
    ProxyOutput o(meta, tok.get(), *g);
    std::string got = feed(o, evs, 0, k);  // the events that reached the front end before the worker died
    const InternalControl c = o.control(1000, replay_exact);
    EXPECT_EQ(c.generated.size(), k);
    Worker w1(tok);  // a fresh worker: nothing cached, sampler and output state rebuilt
    const std::vector<StreamEvent> rest = w1.run(encode_control(c) + "\n" + body);
    got += feed(o, rest, 0, rest.size());
    ASSERT_TRUE(o.finished()) << "cut after " << k;
    if (!g->stream) got = o.body();
    EXPECT_EQ(got, want) << "cut after " << k << " of " << evs.size() << " events";
    // The continuation recomputes prompt + generated once, then decodes. Exact replay: the
    // prompt in one pass, then each generated token in a pass of its own (as decode did);
    // prefill replay: prompt + generated in one pass.
    EXPECT_EQ(w1.engine.tokens_processed, static_cast<int64_t>(g->prompt.size() + k + rest.size()) - 1) << k;
    EXPECT_EQ(w1.engine.n_forward, static_cast<int64_t>(rest.size() + (replay_exact ? k : 0))) << k;
  }
}

// The generated text of a plain greedy run, for choosing stop strings that cut it mid-way.
std::string greedy_text(const std::string& body) {
  auto tok = bytes_tokenizer();
  auto g = parse_request(Endpoint::completions, body, *tok, nullptr, limits(), 1);
  ProxyOutput o(ResponseMeta{"x", "m", 0, Endpoint::completions, false, ""}, tok.get(), *g);
  Worker w(tok);
  for (const StreamEvent& e : w.run(encode_control(o.control(1000)) + "\n" + body)) o.add(e);
  return nlohmann::json::parse(o.body())["choices"][0]["text"].get<std::string>();
}

TEST(Resume, GreedyStreamContinuesExactlyAfterEveryCut) {
  expect_every_cut_continues_exactly(
      R"({"prompt":[10,20,30],"max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true}})");
}

// A constrained answer (structured outputs): the new worker's grammar replays the generated
// tokens, so its masks, and the bytes, continue exactly.
TEST(Resume, ConstrainedAnswerContinuesExactlyAfterEveryCut) {
  expect_every_cut_continues_exactly(
      R"J({"prompt":"ab","max_tokens":40,"temperature":1,"seed":3,"stream":true,"guided_regex":"[a-c]{3,12}(x|yz)"})J");
  const std::string choice = R"({"prompt":"ab","max_tokens":60,"temperature":0.8,"seed":9,"guided_choice":["alpha","beta gamma"]})";
  expect_every_cut_continues_exactly(choice);
  const std::string text = greedy_text(choice);
  EXPECT_TRUE(text == "alpha" || text == "beta gamma") << text;
}

TEST(Resume, PrefillReplayGivesTheSameBytesInOnePass) {
  // (The fake engine computes a token's logits the same way in any pass; a real engine's
  // prefill and decode paths may differ in the last bits, which is why exact is the default.)
  expect_every_cut_continues_exactly(R"({"prompt":[10,20,30],"max_tokens":24,"temperature":1,"seed":5,"stream":true})",
                                     /*replay_exact=*/false);
}

TEST(Resume, SeededSamplingContinuesExactlyAfterEveryCut) {
  // temperature 1: every token draws a random number, so the continuation must start at the
  // original's position in the stream; with logprobs the alternatives come along too.
  expect_every_cut_continues_exactly(
      R"({"prompt":[1,2,3,4,5],"max_tokens":30,"temperature":1,"seed":99,"logprobs":3,"stream":true})");
  expect_every_cut_continues_exactly(R"({"prompt":[1,2,3,4,5],"max_tokens":30,"temperature":1,"seed":99})");
}

TEST(Resume, StopStringHeldBackAcrossTheCut) {
  // A stop string from the middle of the greedy text (and its prefix held back before it
  // completes): the continuation must hold back and cut exactly where the original does.
  const std::string base = R"({"prompt":[10,20,30],"max_tokens":40,"temperature":0)";
  const std::string text = greedy_text(base + "}");
  // Three ASCII bytes from the second half (a stop string must be valid UTF-8).
  auto ascii_at = [&](size_t from, size_t n) {
    for (size_t i = from; i + n <= text.size(); ++i) {
      bool ok = true;
      for (size_t j = i; j < i + n; ++j) ok = ok && static_cast<unsigned char>(text[j]) < 0x80;
      if (ok) return text.substr(i, n);
    }
    return std::string();
  };
  const std::string stop = ascii_at(text.size() / 2, 3), held = ascii_at(0, 2);
  ASSERT_FALSE(stop.empty() || held.empty()) << text;
  const std::string stops = nlohmann::json(std::vector<std::string>{stop, held + "\x01"}).dump();
  expect_every_cut_continues_exactly(base + R"(,"stream":true,"stop":)" + stops + "}");
  expect_every_cut_continues_exactly(base + R"(,"stop":)" + stops + "}");
}

// The sampler's position is what makes a seeded continuation equal the original: the same
// continuation with the position dropped goes another way.
TEST(Resume, WrongSamplerPositionChangesTheOutput) {
  auto tok = bytes_tokenizer();
  const std::string body = R"({"prompt":[1,2,3,4,5],"max_tokens":30,"temperature":1,"seed":99})";
  auto g = parse_request(Endpoint::completions, body, *tok, nullptr, limits(), 1);
  ASSERT_TRUE(g.ok());
  ProxyOutput ref(ResponseMeta{"x", "m", 0, Endpoint::completions, false, ""}, tok.get(), *g);
  Worker w0(tok);
  auto evs = w0.run(encode_control(ref.control(1000)) + "\n" + body);
  feed(ref, evs, 0, evs.size());
  ProxyOutput o(ResponseMeta{"x", "m", 0, Endpoint::completions, false, ""}, tok.get(), *g);
  feed(o, evs, 0, 10);
  InternalControl c = o.control(1000);
  EXPECT_EQ(c.rng_draws, 10u);
  c.rng_draws = 0;
  Worker w1(tok);
  auto rest = w1.run(encode_control(c) + "\n" + body);
  feed(o, rest, 0, rest.size());
  EXPECT_NE(o.body(), ref.body());
}

// What a worker refuses in a control line: values that do not fit the model or the request.
TEST(Resume, WorkerRefusesControlLinesThatDoNotFit) {
  auto tok = bytes_tokenizer();
  const std::string body = R"({"prompt":[1,2],"max_tokens":4,"temperature":1})";
  auto refuse = [&](InternalControl c) {
    Worker w(tok);
    Status err;
    auto evs = w.run(encode_control(c) + "\n" + body, &err);
    EXPECT_TRUE(evs.empty());
    EXPECT_EQ(err.code(), StatusCode::invalid_argument);
    return err.message();
  };
  InternalControl ok;
  ok.prompt = {1, 2};
  ok.max_tokens = 4;
  ok.seed = 3;
  InternalControl c = ok;
  c.prompt = {1, 999};
  EXPECT_NE(refuse(c).find("prompt[1] = 999 is outside the vocabulary"), std::string::npos);
  c = ok;
  c.prompt.clear();
  EXPECT_NE(refuse(c).find("prompt is empty"), std::string::npos);
  c = ok;
  c.max_tokens = 4095;
  EXPECT_NE(refuse(c).find("does not fit the context"), std::string::npos);
  c = ok;
  c.generated = {5, 6, 7, 8};
  EXPECT_NE(refuse(c).find("leave nothing"), std::string::npos);
  c = ok;
  c.generated = {5};
  c.rng_draws = 2;
  EXPECT_NE(refuse(c).find("more than one draw per generated token"), std::string::npos);
  c = ok;
  c.generated = {256};  // eos: the original had finished
  EXPECT_NE(refuse(c).find("ends the output"), std::string::npos);
}

}  // namespace
}  // namespace afd::serve::test_resume
