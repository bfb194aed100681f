// The front end's failover (serve/frontend/proxy_session.h) against scripted attention workers:
// Fake servers (http::Server) that answer /health as attention workers of the front end's model and
// speak the internal stream (serve/api/internal_stream.h), each failing in its own way — the
// connection cut mid-stream, silence past the idle timeout, no worker left to continue —
// while a healthy one checks the continuation's control line and finishes the request.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../unit/serve/http_test_client.h"
#include "frontend_test_model.h"
#include "serve/api/internal_stream.h"
#include "serve/frontend/frontend.h"
#include "serve/http/server.h"

namespace afd::serve {
namespace {

using json = nlohmann::json;

// The event a worker sends for generated token i (id 100 + i, text "t<i> ").
StreamEvent token_event(int i, int n_total, int64_t n_prompt) {
  StreamEvent e;
  e.text = "t" + std::to_string(i) + " ";
  TokenInfo t;
  t.token = 100 + i;
  t.logprob = -0.5f;
  e.tokens.push_back(t);
  e.rng_draws = static_cast<uint64_t>(i + 1);
  if (i + 1 == n_total) {
    e.finish = FinishReason::length;
    e.prompt_tokens = n_prompt;
    e.completion_tokens = n_total;
  }
  return e;
}

constexpr const char* kNumerics = "fp_00000000000000aa";

enum class Behaviour {
  finish,     // continues from the control line's generated tokens to max_tokens
  cut,        // sends `cut_after` token events, then closes the connection mid-body and
              // answers /health 503 from then on (a process that died)
  stall,      // sends `cut_after` token events, then nothing until the test ends (/health
              // still 200: the front end must prefer a worker this request has not failed on)
  unhealthy,  // /health 503
};

class FakeWorker {
 public:
  // numerics: the system_fingerprint its /health reports.
  FakeWorker(Behaviour b, const std::string& fingerprint, int cut_after, std::string numerics = kNumerics)
      : b_(b), cut_after_(cut_after) {
    srv_.get("/health", [this, fingerprint, numerics](const http::Request&, http::Response& res) {
      if (b_ == Behaviour::unhealthy || dead_) {
        res.status = 503;
        res.set_content(R"({"error":{"message":"FFN worker 'ffn0' is not connected"}})", "application/json");
        return;
      }
      res.set_content(json{{"status", "ok"},
                           {"role", "attention"},
                           {"model", "m"},
                           {"model_config", fingerprint},
                           {"system_fingerprint", numerics}}
                          .dump(),
                      "application/json");
    });
    srv_.post("/v1/completions", [this](const http::Request& req, http::Response& res) {
      auto b = split_internal_body(req.body);
      if (!b.ok() || req.get_header_value(kInternalStreamHeader) != "1") {
        res.status = 400;
        return;
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        controls_.push_back(b->control);
      }
      const InternalControl c = b->control;
      res.set_chunked_content_provider("text/event-stream", [this, c](size_t, http::DataSink& sink) {
        const int n_total = static_cast<int>(c.max_tokens);
        const int from = static_cast<int>(c.generated.size());
        const int until = b_ == Behaviour::finish ? n_total : std::min(n_total, from + cut_after_);
        for (int i = from; i < until; ++i) {
          const std::string ev = encode_event(token_event(i, n_total, static_cast<int64_t>(c.prompt.size())));
          if (!sink.write(ev.data(), ev.size())) return false;
        }
        if (b_ == Behaviour::finish) {
          sink.done();
          return true;
        }
        if (b_ == Behaviour::stall) {
          std::unique_lock<std::mutex> l(mu_);
          cv_.wait_for(l, std::chrono::seconds(20), [this] { return ending_; });
        }
        dead_ = true;
        return false;  // the connection ends without the body's end
      });
    });
    auto bound = srv_.bind();
    port_ = bound.ok() ? *bound : -1;
    thread_ = std::thread([this] { (void)srv_.run(); });
  }
  ~FakeWorker() {
    {
      std::lock_guard<std::mutex> l(mu_);
      ending_ = true;
    }
    cv_.notify_all();
    srv_.stop();
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Down (its /health 503, as with its FFN worker lost) or up again.
  void set_down(bool down) { dead_ = down; }
  std::vector<InternalControl> controls() {
    std::lock_guard<std::mutex> l(mu_);
    return controls_;
  }

 private:
  http::Server srv_{http::Options{}};
  Behaviour b_;
  int cut_after_;
  int port_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ending_ = false;
  std::atomic<bool> dead_{false};
  std::vector<InternalControl> controls_;
};

class FailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = frontend_model_dir("failover");
    ASSERT_FALSE(dir_.empty());
    fingerprint_ = frontend_model_fingerprint(dir_);
    ASSERT_FALSE(fingerprint_.empty());
  }
  void TearDown() override {
    if (fe_) fe_->stop();
    if (run_.valid()) run_.wait();
    fe_.reset();
    workers_.clear();
    std::filesystem::remove_all(dir_);
  }
  // Starts the workers (in order: the first takes the first placement) and a front end.
  void start(std::vector<std::pair<Behaviour, int>> ws, double idle_s, double failover_s) {
    FrontendOptions fo;
    fo.server.port = 0;
    fo.server.http_threads = 8;
    fo.model_dir = dir_;
    fo.model_name = "m";
    fo.health_interval_ms = 20;
    fo.federate = false;
    fo.proxy.idle_timeout_s = idle_s;
    fo.proxy.failover_timeout_s = failover_s;
    fo.proxy.wait_for_worker_s = wait_for_worker_s_;
    for (auto [b, n] : ws) {
      const size_t i = workers_.size();
      workers_.push_back(std::make_unique<FakeWorker>(b, fingerprint_, n, i < numerics_.size() ? numerics_[i] : kNumerics));
      fo.workers.push_back(workers_.back()->address());
    }
    auto f = Frontend::create(fo);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    fe_ = std::move(*f);
    ASSERT_TRUE(fe_->start().is_ok());
    Frontend* raw = fe_.get();
    run_ = std::async(std::launch::async, [raw] { return raw->run(); });
    int want_up = 0;
    for (auto [b, n] : ws) want_up += b == Behaviour::unhealthy ? 0 : 1;
    for (int i = 0; i < 500 && fe_->workers_up() < want_up; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(fe_->workers_up(), want_up) << fe_->why_workers_down();
    cli_ = std::make_unique<testing::TestClient>("127.0.0.1", fe_->port());
  }
  std::optional<testing::HttpResult> post(const std::string& body) { return cli_->post("/v1/completions", body); }
  static std::vector<json> sse(const std::string& body) {
    std::vector<json> out;
    size_t i = 0;
    while ((i = body.find("data: ", i)) != std::string::npos) {
      const size_t e = body.find("\n\n", i);
      const std::string d = body.substr(i + 6, e - i - 6);
      out.push_back(d == "[DONE]" ? json("[DONE]") : json::parse(d));
      i = e;
    }
    return out;
  }
  static std::string expected_text(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += "t" + std::to_string(i) + " ";
    return s;
  }

  double wait_for_worker_s_ = 0;  // FrontendOptions::proxy.wait_for_worker_s of start()
  std::vector<std::string> numerics_;  // the system_fingerprint of start()'s workers (default kNumerics)
  std::string dir_, fingerprint_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::unique_ptr<Frontend> fe_;
  std::future<Status> run_;
  std::unique_ptr<testing::TestClient> cli_;
};

// A worker whose connection breaks after 3 tokens: the request continues on the other
// worker, whose control line carries the prompt, max_tokens, seed, the 3 tokens and the
// sampler position; the client gets one seamless stream (one id, every token once, usage).
TEST_F(FailoverTest, CutMidStreamContinuesElsewhereSeamlessly) {
  start({{Behaviour::cut, 3}, {Behaviour::finish, 0}}, 5, 10);
  auto r = post(R"({"prompt":[1,2,3],"max_tokens":8,"temperature":1,"seed":77,"stream":true,
                    "stream_options":{"include_usage":true}})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<json> ev = sse(r->body);
  ASSERT_EQ(ev.size(), 8u + 2u) << r->body;  // 8 token chunks, usage, [DONE]
  std::string text;
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(ev[i]["id"], ev[0]["id"]);
    text += ev[i]["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, expected_text(8));
  EXPECT_EQ(ev[7]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ev[8]["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(ev[8]["usage"]["completion_tokens"], 8);
  EXPECT_EQ(ev[9], "[DONE]");
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(ev[i]["system_fingerprint"], kNumerics);  // what both workers report
  const auto first = workers_[0]->controls(), second = workers_[1]->controls();
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(first[0].prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(first[0].generated.empty());
  EXPECT_EQ(second[0].prompt, first[0].prompt);
  EXPECT_EQ(second[0].max_tokens, 8);
  EXPECT_EQ(second[0].seed, 77u);
  EXPECT_EQ(second[0].generated, (std::vector<int32_t>{100, 101, 102}));
  EXPECT_EQ(second[0].rng_draws, 3u);
  EXPECT_TRUE(second[0].replay_exact);
  EXPECT_NE(fe_->render_metrics().find("afd_frontend_failovers_total 1\n"), std::string::npos) << fe_->render_metrics();
}

// Workers that report different system_fingerprints (another ISA level, another mode): the
// front end cannot say which numbers an answer has, so its responses leave the field out.
TEST_F(FailoverTest, WorkersThatDisagreeOnNumericsLeaveTheFingerprintOut) {
  numerics_ = {"fp_00000000000000aa", "fp_00000000000000bb"};
  start({{Behaviour::finish, 0}, {Behaviour::finish, 0}}, 5, 10);
  auto r = post(R"({"prompt":[1,2,3],"max_tokens":2})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(json::parse(r->body).contains("system_fingerprint")) << r->body;
}

// A worker that goes silent after 2 tokens (a stopped process): after the idle timeout the
// request continues elsewhere; a non-streaming client just gets its answer.
TEST_F(FailoverTest, SilentWorkerIsLeftAfterTheIdleTimeout) {
  start({{Behaviour::stall, 2}, {Behaviour::finish, 0}}, 0.5, 10);
  auto r = post(R"({"prompt":[4,5],"max_tokens":6,"temperature":0})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], expected_text(6));
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  const auto second = workers_[1]->controls();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].generated, (std::vector<int32_t>{100, 101}));
  const std::string m = fe_->render_metrics();
  EXPECT_NE(m.find("afd_frontend_upstream_stalls_total 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_failovers_total 1\n"), std::string::npos) << m;
}

// No worker can take the request over within --failover-timeout-s: a stream that has bytes
// ends with an error event naming why; a request without bytes gets 503 + Retry-After.
TEST_F(FailoverTest, NoWorkerToContinueFailsAfterTheFailoverTimeout) {
  start({{Behaviour::cut, 2}, {Behaviour::unhealthy, 0}}, 5, 0.5);
  auto r = post(R"({"prompt":[1],"max_tokens":6,"temperature":0,"stream":true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<json> ev = sse(r->body);
  ASSERT_EQ(ev.size(), 2u + 2u) << r->body;  // 2 token chunks, the error, [DONE]
  EXPECT_EQ(ev[0]["choices"][0]["text"].get<std::string>() + ev[1]["choices"][0]["text"].get<std::string>(),
            expected_text(2));
  const std::string why = ev[2]["error"]["message"].get<std::string>();
  EXPECT_EQ(ev[2]["error"]["code"], 503);
  EXPECT_NE(why.find("no attention worker took the request over within 0.5 s"), std::string::npos) << why;
  EXPECT_NE(why.find("FFN worker 'ffn0' is not connected"), std::string::npos) << why;
  EXPECT_EQ(ev[3], "[DONE]");

  // Cut before its first token: the client has nothing yet, so the answer is a plain 503.
  workers_.clear();
  fe_->stop();
  run_.wait();
  fe_.reset();
  start({{Behaviour::cut, 0}, {Behaviour::unhealthy, 0}}, 5, 0.5);
  auto q = post(R"({"prompt":[1],"max_tokens":6,"temperature":0})");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->status, 503) << q->body;
  EXPECT_EQ(q->get_header_value("Retry-After"), "1");
  EXPECT_NE(json::parse(q->body)["error"]["message"].get<std::string>().find("took the request over"),
            std::string::npos)
      << q->body;
}

// --wait-for-worker-s: a new request that finds no worker up waits for one instead of an
// immediate 503, and gets 503 (saying how long it waited) when none comes up in time.
TEST_F(FailoverTest, ANewRequestWaitsForAWorkerToBeUp) {
  wait_for_worker_s_ = 20;
  start({{Behaviour::finish, 0}}, 5, 10);
  workers_[0]->set_down(true);
  for (int i = 0; i < 500 && fe_->workers_up() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(fe_->workers_up(), 0);
  auto pending = std::async(std::launch::async, [this] { return post(R"({"prompt":[7],"max_tokens":4})"); });
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  workers_[0]->set_down(false);
  auto r = pending.get();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], expected_text(4));
  const std::string m = fe_->render_metrics();
  EXPECT_NE(m.find("afd_frontend_waited_total 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_unavailable_total 0\n"), std::string::npos) << m;

  workers_.clear();
  fe_->stop();
  run_.wait();
  fe_.reset();
  wait_for_worker_s_ = 0.3;
  start({{Behaviour::unhealthy, 0}}, 5, 10);
  auto q = post(R"({"prompt":[7],"max_tokens":4})");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->status, 503) << q->body;
  EXPECT_EQ(q->get_header_value("Retry-After"), "1");
  EXPECT_NE(q->body.find("no attention worker is available within 0.3 s"), std::string::npos) << q->body;
}

}  // namespace
}  // namespace afd::serve
