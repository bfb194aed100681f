// The HTTP API end to end over loopback, with fake engines behind the real Service
// (tokenizer files from write_tokenizer_files, scheduler, router, metrics, TestClient).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../unit/serve/fake_engine.h"
#include "../../unit/serve/http_test_client.h"
#include "frontend_test_model.h"
#include "model/config.h"
#include "model/fingerprint.h"
#include "serve/frontend/frontend.h"
#include "serve/http/server.h"
#include "serve/scheduling/service.h"
#include "serve/text/tokenizer_writer.h"

namespace afd::serve::test_http {
namespace {

using json = nlohmann::json;
using testing::FakeEngine;

class HttpTest : public ::testing::Test {
 protected:
  void start(ServiceOptions so, int n_workers = 2, int64_t blocks = 4096) {
    dir_ = (std::filesystem::temp_directory_path() / ("afd_http_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(write_tokenizer_files(dir_, 1024).ok());
    so.model_dir = dir_;
    so.model_name = "tiny";
    so.server.port = 0;
    std::vector<std::unique_ptr<Engine>> engines;
    for (int i = 0; i < n_workers; ++i) {
      auto e = std::make_unique<FakeEngine>(1024, 256, blocks, 16);
      engines_.push_back(e.get());
      engines.push_back(std::move(e));
    }
    auto s = Service::create(so, std::move(engines));
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    svc_ = std::move(*s);
    ASSERT_TRUE(svc_->start().is_ok());
    thread_ = std::thread([this] { (void)svc_->run(); });
    cli_ = std::make_unique<testing::TestClient>("127.0.0.1", svc_->port());
    for (int i = 0; i < 100; ++i) {
      if (auto r = cli_->get("/health"); r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  void TearDown() override {
    if (svc_) svc_->stop();
    if (thread_.joinable()) thread_.join();
    svc_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::optional<testing::HttpResult> post(const std::string& path, const std::string& body, const http::Headers& h = {}) {
    return cli_->post(path, body, h);
  }
  // Parses an SSE body into its data payloads.
  static std::vector<std::string> sse_data(const std::string& body) {
    std::vector<std::string> out;
    size_t i = 0;
    while ((i = body.find("data: ", i)) != std::string::npos) {
      size_t e = body.find("\n\n", i);
      out.push_back(body.substr(i + 6, e - i - 6));
      i = e;
    }
    return out;
  }

  std::string dir_;
  std::vector<FakeEngine*> engines_;
  std::unique_ptr<Service> svc_;
  std::thread thread_;
  std::unique_ptr<testing::TestClient> cli_;
};

TEST_F(HttpTest, CompletionsAndChatNonStreaming) {
  start({});
  auto r = post("/v1/completions", R"({"model":"tiny","prompt":[5,6,7],"max_tokens":4,"temperature":0,"logprobs":2})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 4u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
  // The text is the decoded greedy continuation of the fake engine.
  auto c = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hello there"}],"max_tokens":3,
      "temperature":0,"logprobs":true,"top_logprobs":1})");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  json k = json::parse(c->body);
  EXPECT_EQ(k["object"], "chat.completion");
  EXPECT_EQ(k["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(k["choices"][0]["message"]["content"].is_string());
  EXPECT_EQ(k["choices"][0]["logprobs"]["content"].size(), 3u);
  EXPECT_EQ(k["usage"]["completion_tokens"], 3);
  auto m = cli_->get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "tiny");
}

// A second server on a port that is in use is a clear error, not a silent co-listener
// (with SO_REUSEPORT the kernel would split connections between them).
// A ready attention server's /health says what it is and which model it serves (the front
// end checks both before placing requests on it).
TEST_F(HttpTest, HealthSaysRoleAndModel) {
  start(ServiceOptions{});
  auto r = cli_->get("/health");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  json h = json::parse(r->body);
  EXPECT_EQ(h["status"], "ok");
  EXPECT_EQ(h["role"], "attention");
  EXPECT_EQ(h["model"], "tiny");
  ASSERT_TRUE(h["model_config"].is_string());
  EXPECT_EQ(h["model_config"].get<std::string>().size(), 16u);
  EXPECT_EQ(h["deterministic"], false);
}

// The numerics identity (runtime/system_fingerprint.h) the service is given: in every response
// and chunk as OpenAI's system_fingerprint, on /health, and as afd_numerics_info on /metrics.
TEST_F(HttpTest, SystemFingerprintAndDeterministicMode) {
  ServiceOptions so;
  so.system_fingerprint = "fp_0123456789abcdef";
  so.deterministic = true;
  start(so);
  auto r = post("/v1/completions", R"({"prompt":[5,6,7],"max_tokens":2,"temperature":0})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["system_fingerprint"], "fp_0123456789abcdef");
  auto s = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,
      "stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200) << s->body;
  int chunks = 0;
  for (const std::string& d : sse_data(s->body)) {
    if (d == "[DONE]") continue;
    EXPECT_EQ(json::parse(d)["system_fingerprint"], "fp_0123456789abcdef") << d;
    ++chunks;
  }
  EXPECT_GE(chunks, 3);  // role, tokens, usage
  json h = json::parse(cli_->get("/health")->body);
  EXPECT_EQ(h["system_fingerprint"], "fp_0123456789abcdef");
  EXPECT_EQ(h["deterministic"], true);
  auto m = cli_->get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("afd_numerics_info{system_fingerprint=\"fp_0123456789abcdef\",deterministic=\"1\"} 1"),
            std::string::npos);
}

TEST_F(HttpTest, PortInUseIsAClearError) {
  start({});
  ServiceOptions so;
  so.model_dir = dir_;
  so.model_name = "tiny";
  so.server.port = svc_->port();
  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(std::make_unique<FakeEngine>(1024, 256, 64, 16));
  auto second = Service::create(so, std::move(engines));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  Status st = (*second)->start();
  EXPECT_EQ(st.code(), StatusCode::io_error) << st.to_string();
  EXPECT_NE(st.message().find(std::to_string(svc_->port())), std::string::npos) << st.to_string();
  (*second)->stop();
  auto r = cli_->get("/health");  // the first one still answers
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpTest, StreamingEndsWithDoneAndUsage) {
  start({});
  auto r = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,
      "stream_options":{"include_usage":true},"logprobs":true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto data = sse_data(r->body);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(data.back(), "[DONE]");
  json usage = json::parse(data[data.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
  int n_tokens = 0;
  std::string finish;
  for (size_t i = 0; i + 2 < data.size(); ++i) {
    json ch = json::parse(data[i]);
    EXPECT_EQ(ch["object"], "chat.completion.chunk");
    EXPECT_TRUE(ch["usage"].is_null());
    n_tokens += static_cast<int>(ch["choices"][0]["logprobs"]["content"].size());
    if (!ch["choices"][0]["finish_reason"].is_null()) finish = ch["choices"][0]["finish_reason"];
    if (i == 0) {
      EXPECT_EQ(ch["choices"][0]["delta"]["role"], "assistant");
    }
  }
  EXPECT_EQ(n_tokens, 5);
  EXPECT_EQ(finish, "length");
  auto c = post("/v1/completions", R"({"prompt":"abc","max_tokens":3,"stream":true})");
  ASSERT_TRUE(c);
  auto cd = sse_data(c->body);
  EXPECT_EQ(cd.back(), "[DONE]");
  EXPECT_EQ(json::parse(cd[0])["object"], "text_completion");
}

TEST_F(HttpTest, ErrorsAreOpenAiShaped) {
  ServiceOptions so;
  so.server.limits.max_body_bytes = 4096;
  start(so);
  auto bad = post("/v1/completions", "{oops");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  json e = json::parse(bad->body);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"]["message"].is_string());
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","n":3})")->status, 400);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":[1,99999]})")->status, 400);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":0})")->status, 400);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","model":"nope"})")->status, 404);
  auto big = post("/v1/completions", "{\"prompt\":\"" + std::string(10000, 'a') + "\"}");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_EQ(cli_->get("/nope")->status, 404);
}

TEST_F(HttpTest, ApiKeyIsRequiredOnV1) {
  ServiceOptions so;
  so.server.api_key = "sekret";
  start(so);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":1})")->status, 401);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":1})", {{"Authorization", "Bearer wrong"}})->status, 401);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":1})", {{"Authorization", "Bearer sekret"}})->status, 200);
  EXPECT_EQ(cli_->get("/health")->status, 200);  // health stays open
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "abcd"));
}

TEST_F(HttpTest, OverCapacityIs429WithRetryAfter) {
  ServiceOptions so;
  so.scheduler.max_queue = 0;
  start(so, 1);
  auto r = post("/v1/completions", R"({"prompt":"a","max_tokens":1})");
  ASSERT_TRUE(r) << cli_->error();
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
}

TEST_F(HttpTest, ClientDisconnectMidStreamCancels) {
  start({}, 1);
  // Each step takes at least 5 ms, so the 200 tokens take a second or more: the cancel must come
  // long before the last token however fast the machine (or slow under load) is.
  engines_[0]->forward_delay_ms = 5;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(svc_->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::string body = R"({"prompt":[1,2],"max_tokens":200,"stream":true,"ignore_eos":true})";
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  char buf[512];
  ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);  // headers / first chunk arrived
  ::close(fd);
  // The scheduler frees the sequence within a few steps of the failed write.
  bool freed = false;
  for (int i = 0; i < 300 && !freed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    freed = engines_[0]->live_sequences() == 0 && svc_->metrics().requests_cancelled.load() == 1;
  }
  EXPECT_TRUE(freed);
  EXPECT_LT(engines_[0]->tokens_processed, 200);
}

// A non-streaming client that goes away before its answer is ready cancels the request:
// the handler notices the closed connection while waiting and the scheduler frees the
// sequence long before max_tokens would have been generated.
TEST_F(HttpTest, ClientDisconnectBeforeNonStreamingAnswerCancels) {
  start({}, 1);
  engines_[0]->forward_delay_ms.store(20);  // 200 tokens would take >= 4 s
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(svc_->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::string body = R"({"prompt":[1,2],"max_tokens":200,"ignore_eos":true})";
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  // Wait until the request runs, then hang up without reading anything.
  for (int i = 0; i < 300 && engines_[0]->live_sequences() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(engines_[0]->live_sequences(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  ::close(fd);
  bool freed = false;
  for (int i = 0; i < 200 && !freed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    freed = engines_[0]->live_sequences() == 0 && svc_->metrics().requests_cancelled.load() == 1;
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(freed);
  EXPECT_LT(waited, 0.5);  // 50 ms polling + one 20 ms step, with slack for a loaded machine
  EXPECT_LT(engines_[0]->tokens_processed, 100);
  EXPECT_NE(svc_->metrics().render().find("afd_requests_total{code=\"499\"} 1"), std::string::npos);
  // A client that stays connected is not affected: a normal non-streaming request completes.
  engines_[0]->forward_delay_ms.store(0);
  auto r = post("/v1/completions", R"({"prompt":[1,2],"max_tokens":5,"ignore_eos":true})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 5);
}

// HTTP/1.1 pipelining: a non-streaming and a streaming completion sent in one segment on
// one connection are both answered, in order (the second waits in the connection's buffer).
TEST_F(HttpTest, PipelinedCompletionsAreAnsweredInOrder) {
  start({}, 1);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(svc_->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  auto req = [](const std::string& body) {
    return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const std::string both = req(R"({"prompt":[1,2],"max_tokens":3,"ignore_eos":true})") +
                           req(R"({"prompt":[3,4],"max_tokens":2,"ignore_eos":true,"stream":true})");
  ASSERT_EQ(::send(fd, both.data(), both.size(), 0), static_cast<ssize_t>(both.size()));
  std::string got;
  char buf[4096];
  const auto t0 = std::chrono::steady_clock::now();
  while (got.find("data: [DONE]") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t first = got.find("HTTP/1.1 200");
  const size_t second = got.find("HTTP/1.1 200", first + 1);
  ASSERT_NE(first, std::string::npos) << got;
  ASSERT_NE(second, std::string::npos) << got;
  const size_t json_at = got.find("\"completion_tokens\":3");
  EXPECT_LT(json_at, second) << got;                                     // the JSON answer first
  EXPECT_NE(got.find("text/event-stream", second), std::string::npos) << got;  // then the stream
  EXPECT_NE(got.find("data: [DONE]", second), std::string::npos) << got;
}

TEST_F(HttpTest, MetricsAndRoutingAcrossWorkers) {
  start({}, 2);
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([this, i] {
      testing::TestClient c("127.0.0.1", svc_->port());
      auto r = c.post("/v1/completions", "{\"prompt\":[" + std::to_string(i + 1) + ",2,3],\"max_tokens\":20,\"ignore_eos\":true}");
      EXPECT_TRUE(r && r->status == 200);
    });
  for (auto& t : ts) t.join();
  EXPECT_GT(engines_[0]->n_forward, 0);
  EXPECT_GT(engines_[1]->n_forward, 0);
  // A response can reach the client just before its request is counted: poll briefly.
  const std::vector<std::string> want = {"afd_requests_total{code=\"200\"} 8", "afd_generation_tokens_total 160",
                                         "afd_time_to_first_token_seconds_count 8", "afd_kv_usage_ratio{worker=\"1\"}",
                                         "afd_stage_seconds_total{worker=\"0\",stage=\"attention\"}",
                                         "afd_worker_idle_ratio"};
  std::string body;
  for (int i = 0; i < 200; ++i) {
    auto m = cli_->get("/metrics");
    ASSERT_TRUE(m);
    body = m->body;
    bool all = true;
    for (const auto& s : want) all = all && body.find(s) != std::string::npos;
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& s : want) EXPECT_NE(body.find(s), std::string::npos) << s;
}

// Graceful shutdown: after drain(), /health and new requests answer 503 "draining", the
// requests accepted before run to their last token (JSON and SSE), and drained() turns true
// only once they have.
TEST_F(HttpTest, DrainFinishesAcceptedRequestsAndRefusesNewOnes) {
  start({}, 1);
  engines_[0]->forward_delay_ms = 10;  // 20 tokens: ~200 ms in flight
  auto run = [this](bool stream) {
    testing::TestClient c("127.0.0.1", svc_->port());
    std::string body = std::string(R"({"prompt":[5,6,7],"max_tokens":20,"temperature":0,"ignore_eos":true)") +
                       (stream ? R"(,"stream":true})" : "}");
    auto r = c.post("/v1/completions", body);
    return r ? std::make_pair(r->status, r->body) : std::make_pair(-1, std::string());
  };
  auto json_answer = std::async(std::launch::async, run, false);
  auto sse_answer = std::async(std::launch::async, run, true);
  for (int i = 0; i < 400 && engines_[0]->live_sequences() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(engines_[0]->live_sequences(), 2) << "the requests never started";
  svc_->drain();
  EXPECT_FALSE(svc_->drained());
  auto h = cli_->get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_NE(h->body.find("draining"), std::string::npos) << h->body;
  auto refused = post("/v1/completions", R"({"prompt":[1],"max_tokens":2})");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_NE(refused->body.find("draining"), std::string::npos) << refused->body;
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");

  auto [js, jb] = json_answer.get();
  ASSERT_EQ(js, 200) << jb;
  EXPECT_EQ(json::parse(jb)["usage"]["completion_tokens"], 20);
  auto [ss, sb] = sse_answer.get();
  ASSERT_EQ(ss, 200) << sb;
  auto events = sse_data(sb);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length") << sb;
  bool drained = false;
  for (int i = 0; i < 200 && !(drained = svc_->drained()); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(drained);
}

// Frontend::stop() ends run() whenever it comes: before run(), while run() is starting to
// listen (a stop that precedes the listening loop must not be lost), or while it listens.
TEST(FrontendStop, EndsRunWheneverItComes) {
  const std::string dir = frontend_model_dir("stop");
  ASSERT_FALSE(dir.empty());
  for (int i = 0; i < 30; ++i) {
    FrontendOptions fo;
    fo.server.port = 0;
    fo.server.http_threads = 2;
    fo.workers = {"127.0.0.1:1"};  // never up: nothing to proxy to
    fo.model_dir = dir;
    auto f = Frontend::create(fo);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    ASSERT_TRUE((*f)->start().is_ok());
    Frontend* raw = f->get();
    if (i % 3 == 0) raw->stop();  // before run()
    auto run = std::async(std::launch::async, [raw] { return raw->run(); });
    if (i % 3 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // listening by now
    raw->stop();  // i % 3 == 2: racing run()'s start
    ASSERT_EQ(run.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "round " << i;
    EXPECT_TRUE(run.get().is_ok());
  }
  std::filesystem::remove_all(dir);
}

// The front end keeps requests off a worker whose /health answers 200 but which is not an
// attention server (an FFN worker's metrics port given by mistake) or serves another model,
// and says why; a worker of its own model is placed on.
TEST(FrontendIdentity, RefusesNonAttentionAndOtherModelWorkers) {
  const std::string dir = frontend_model_dir("id");
  ASSERT_FALSE(dir.empty());
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  char mine[17];
  std::snprintf(mine, sizeof mine, "%016llx", static_cast<unsigned long long>(model_config_fingerprint(*cfg)));
  const std::vector<std::string> bodies = {
      R"({"status":"ok","role":"ffn"})",
      R"({"status":"ok","role":"attention","model":"other","model_config":"0123456789abcdef"})",
      json{{"status", "ok"}, {"role", "attention"}, {"model", "same"}, {"model_config", mine}}.dump()};
  std::vector<std::unique_ptr<http::Server>> fakes;
  std::vector<std::thread> threads;
  std::vector<std::string> addrs;
  for (const std::string& b : bodies) {
    auto s = std::make_unique<http::Server>(http::Options{});
    s->get("/health", [b](const http::Request&, http::Response& res) { res.set_content(b, "application/json"); });
    auto bound = s->bind();
    ASSERT_TRUE(bound.ok()) << bound.status().to_string();
    const int port = *bound;
    addrs.push_back("127.0.0.1:" + std::to_string(port));
    threads.emplace_back([srv = s.get()] { (void)srv->run(); });
    fakes.push_back(std::move(s));
  }
  FrontendOptions fo;
  fo.server.port = 0;
  fo.server.http_threads = 2;
  fo.workers = addrs;
  fo.model_dir = dir;
  fo.health_interval_ms = 20;
  fo.federate = false;
  auto f = Frontend::create(fo);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE((*f)->start().is_ok());
  Frontend* raw = f->get();
  auto run = std::async(std::launch::async, [raw] { return raw->run(); });
  std::string why;
  for (int i = 0; i < 250; ++i) {
    why = raw->why_workers_down();
    if (raw->workers_up() == 1 && why.find("serves another model") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(raw->workers_up(), 1) << why;
  EXPECT_NE(why.find("worker 0: not an attention worker: its /health says role 'ffn'"), std::string::npos) << why;
  EXPECT_NE(why.find("worker 1: serves another model: 'other'"), std::string::npos) << why;
  EXPECT_EQ(why.find("worker 2"), std::string::npos) << why;
  raw->stop();
  EXPECT_TRUE(run.get().is_ok());
  for (auto& s : fakes) s->stop();
  for (auto& t : threads) t.join();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace afd::serve::test_http
