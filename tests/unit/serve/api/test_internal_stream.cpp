#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "serve/api/internal_stream.h"

namespace afd::serve::test_internal_stream {
namespace {

TEST(InternalStream, ControlLineRoundTrip) {
  InternalControl c;
  c.prompt = {1, 2, 300000};
  c.max_tokens = 17;
  c.seed = 18446744073709551615ull;
  c.generated = {5, 6};
  c.rng_draws = 2;
  c.keepalive_ms = 750;
  const std::string line = encode_control(c);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const std::string body = "{\"prompt\":\"hi\\nthere\"}\n";
  auto b = split_internal_body(line + "\n" + body);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->body, body);  // the client's body, byte for byte (its own newlines included)
  EXPECT_EQ(b->control.prompt, c.prompt);
  EXPECT_EQ(b->control.max_tokens, 17);
  EXPECT_EQ(b->control.seed, c.seed);
  EXPECT_EQ(b->control.generated, c.generated);
  EXPECT_EQ(b->control.rng_draws, 2u);
  EXPECT_EQ(b->control.keepalive_ms, 750);
}

TEST(InternalStream, ControlLineErrorsNameTheProblem) {
  auto why = [](const std::string& raw) {
    auto b = split_internal_body(raw);
    EXPECT_FALSE(b.ok()) << raw;
    EXPECT_EQ(b.status().code(), StatusCode::invalid_argument);
    return b.ok() ? std::string() : b.status().message();
  };
  const std::string ok_tail = R"("max_tokens":4,"seed":1,"keepalive_ms":100})";
  EXPECT_NE(why("{\"prompt\":[1]}").find("no control line"), std::string::npos);
  EXPECT_NE(why("not json\n{}").find("not valid JSON"), std::string::npos);
  EXPECT_NE(why("[1]\n{}").find("not a JSON object"), std::string::npos);
  EXPECT_NE(why(std::string(100000, '[') + "\n{}").find("nested deeper"), std::string::npos);
  EXPECT_NE(why(R"({"prompt":[1],"x":1,)" + ok_tail + "\n{}").find("unknown field 'x'"), std::string::npos);
  EXPECT_NE(why(R"({"prompt":[-1],)" + ok_tail + "\n{}").find("prompt: element 0"), std::string::npos);
  EXPECT_NE(why(R"({"prompt":[1],"generated":[1,"a"],)" + ok_tail + "\n{}").find("generated: element 1"),
            std::string::npos);
  EXPECT_NE(why(R"({"prompt":[1],"seed":1,"keepalive_ms":100})" "\n{}").find("'max_tokens' is missing"),
            std::string::npos);
  EXPECT_NE(why(R"({"prompt":[1],"max_tokens":-3,"seed":1,"keepalive_ms":100})" "\n{}").find("max_tokens"),
            std::string::npos);
  EXPECT_NE(why(R"({"prompt":[1],"max_tokens":3,"seed":1,"keepalive_ms":1})" "\n{}").find("keepalive_ms"),
            std::string::npos);
}

// What the worker encodes, the front end decodes to the same event: text, token ids, logprobs
// (floats exactly, -inf as null), top logprobs, sampler position, finish and usage.
TEST(InternalStream, EventRoundTrip) {
  StreamEvent e;
  e.text = "h\xc3\xa9 \"q\"\n";
  TokenInfo a;
  a.token = 42;
  a.logprob = -0.123456789f;
  a.top = {{42, -0.123456789f}, {7, -std::numeric_limits<float>::infinity()}};
  TokenInfo b;
  b.token = 0;
  b.logprob = 0.0f;
  e.tokens = {a, b};
  e.rng_draws = 9;
  e.finish = FinishReason::length;
  e.prompt_tokens = 11;
  e.completion_tokens = 5;
  const std::string wire = encode_event(e);
  ASSERT_EQ(wire.rfind("data: ", 0), 0u);
  ASSERT_EQ(wire.substr(wire.size() - 2), "\n\n");
  auto d = decode_event(std::string_view(wire).substr(6, wire.size() - 8));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const StreamEvent& g = d->event;
  EXPECT_EQ(g.text, e.text);
  ASSERT_EQ(g.tokens.size(), 2u);
  EXPECT_EQ(g.tokens[0].token, 42);
  EXPECT_EQ(g.tokens[0].logprob, a.logprob);
  ASSERT_EQ(g.tokens[0].top.size(), 2u);
  EXPECT_EQ(g.tokens[0].top[1].first, 7);
  EXPECT_TRUE(std::isinf(g.tokens[0].top[1].second) && g.tokens[0].top[1].second < 0);
  EXPECT_TRUE(g.tokens[1].top.empty());
  EXPECT_EQ(g.rng_draws, 9u);
  EXPECT_EQ(g.finish, FinishReason::length);
  EXPECT_EQ(g.prompt_tokens, 11);
  EXPECT_EQ(g.completion_tokens, 5);
  EXPECT_FALSE(d->resumable);
}

// A worker that stops with the request unfinished says so (resumable: another worker may
// continue it); an error of the request or of the FFN side is final, with its HTTP status.
TEST(InternalStream, ErrorEventsSayWhetherAnotherWorkerMayContinue) {
  auto decode = [](const StreamEvent& e) {
    const std::string w = encode_event(e);
    auto d = decode_event(std::string_view(w).substr(6, w.size() - 8));
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return *d;
  };
  StreamEvent stop;
  stop.finish = FinishReason::cancelled;
  stop.error = unavailable("server shutting down");
  InternalEvent s = decode(stop);
  EXPECT_TRUE(s.resumable);
  EXPECT_EQ(s.http_status, 503);
  EXPECT_EQ(s.event.finish, FinishReason::cancelled);
  EXPECT_EQ(s.event.error.message(), "server shutting down");
  StreamEvent kv;
  kv.finish = FinishReason::error;
  kv.error = resource_exhausted("KV cache exhausted");
  InternalEvent k = decode(kv);
  EXPECT_FALSE(k.resumable);
  EXPECT_EQ(k.http_status, 429);
  EXPECT_EQ(k.event.finish, FinishReason::error);
  StreamEvent ffn;
  ffn.finish = FinishReason::error;
  ffn.error = timeout_error("FFN worker 'ffn0': no reply within 2000 ms");
  EXPECT_FALSE(decode(ffn).resumable);
  EXPECT_EQ(decode(ffn).http_status, 503);

  for (const char* bad : {"[]", "{}", R"({"text":"a","tokens":[[1]],"rng":0})", R"({"text":"a","tokens":[],"rng":-1})",
                          R"({"text":"a","tokens":[[1,0.5]],"rng":1,"finish":"stop"})",
                          R"({"text":"a","tokens":[[1,0.5]],"rng":1,"finish":"eos","usage":[1,1]})",
                          R"({"error":{"code":200,"message":"m","resumable":false}})",
                          R"({"error":{"code":503,"message":"m"}})"})
    EXPECT_FALSE(decode_event(bad).ok()) << bad;
}

}  // namespace
}  // namespace afd::serve::test_internal_stream
