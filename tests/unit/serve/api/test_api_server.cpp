// ApiServer over a scripted GenerationBackend: which route asks the backend what, and what
// the API answers itself (closing checks, parse errors, 404 admin, API key) without it.
#include "serve/api/api_server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "../http_test_client.h"
#include "serve/http/server.h"
#include "serve/text/tokenizer_writer.h"

namespace afd::serve::test_api_server {
namespace {

using json = nlohmann::json;

// Answers from fields the test sets; records what the API handed it.
class ScriptedBackend final : public GenerationBackend {
 public:
  bool stopping() const override { return stopping_flag.load(); }
  bool draining() const override { return draining_flag.load(); }
  std::atomic<int>& in_flight() override { return in_flight_n; }
  void count_response(int status) override {
    std::lock_guard<std::mutex> l(mu);
    counted.push_back(status);
  }
  Readiness readiness() const override {
    std::lock_guard<std::mutex> l(mu);
    return ready;
  }
  void set_ready(Readiness r) {
    std::lock_guard<std::mutex> l(mu);
    ready = std::move(r);
  }
  std::string metrics_text() const override { return "backend_metric 1\n"; }
  std::optional<AdminAnswer> admin_ffn(const std::string& method, const std::string& body) override {
    if (!has_admin) return std::nullopt;
    return AdminAnswer{202, json{{"method", method}, {"body", body}}.dump()};
  }
  bool serves_internal_streams() const override { return false; }
  void generate(GenerationCall& call, const http::Request&, http::Response& res) override {
    {
      std::lock_guard<std::mutex> l(mu);
      calls.push_back({call.path, call.meta.id, call.meta.model, call.request.prompt.size(), call.request.max_tokens,
                       in_flight_n.load()});
    }
    res.set_content(R"({"ok":true})", "application/json");
  }
  void extra_routes(http::Server& s) override {
    s.get("/admin/extra", [](const http::Request&, http::Response& res) { res.set_content("extra", "text/plain"); });
  }

  struct Seen {
    std::string path, id, model;
    size_t prompt_tokens;
    int64_t max_tokens;
    int in_flight;  // in_flight() while generate() ran
  };
  std::atomic<bool> stopping_flag{false}, draining_flag{false};
  std::atomic<int> in_flight_n{0};
  Readiness ready{true, R"({"status":"ok"})"};
  std::atomic<bool> has_admin{false};
  mutable std::mutex mu;
  std::vector<int> counted;
  std::vector<Seen> calls;
};

class ApiServerTest : public ::testing::Test {
 protected:
  void start(const std::string& api_key = "") {
    dir_ = (std::filesystem::temp_directory_path() / ("afd_api_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(write_tokenizer_files(dir_, 1024).ok());
    auto tok = Tokenizer::load_dir(dir_);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    model_.tokenizer = *tok;
    model_.limits.model_name = "tiny";
    model_.limits.vocab_size = 1024;
    model_.limits.max_context = 256;
    ServerOptions o;
    o.port = 0;
    o.api_key = api_key;
    o.retry_after_s = 7;
    o.http_threads = 4;
    api_ = std::make_unique<ApiServer>(o, "test api", model_, backend_);
    ASSERT_TRUE(api_->bind().is_ok());
    thread_ = std::thread([this] { (void)api_->run(); });
    cli_ = std::make_unique<testing::TestClient>("127.0.0.1", api_->port());
  }
  void TearDown() override {
    if (api_) api_->stop();
    if (thread_.joinable()) thread_.join();
    api_.reset();
    std::filesystem::remove_all(dir_);
  }
  static std::string error_message(const std::string& body) {
    return json::parse(body).at("error").at("message").get<std::string>();
  }

  std::string dir_;
  ModelServing model_;
  ScriptedBackend backend_;
  std::unique_ptr<ApiServer> api_;
  std::thread thread_;
  std::unique_ptr<testing::TestClient> cli_;
};

TEST_F(ApiServerTest, HealthIsTheBackendsReadinessUnlessClosing) {
  start();
  auto r = cli_->get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, R"({"status":"ok"})");
  backend_.set_ready({false, "engine 0 has no FFN worker"});
  r = cli_->get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "7");
  EXPECT_EQ(error_message(r->body), "engine 0 has no FFN worker");
  backend_.draining_flag = true;
  r = cli_->get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(error_message(r->body), kDrainingHealth);
  backend_.stopping_flag = true;
  r = cli_->get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(error_message(r->body), "shutting down");
}

TEST_F(ApiServerTest, MetricsModelsAdminAndExtraRoutes) {
  start();
  auto r = cli_->get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "backend_metric 1\n");
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4");

  r = cli_->get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  json m = json::parse(r->body);
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["max_model_len"], 256);

  r = cli_->get("/admin/ffn");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  backend_.has_admin = true;
  r = cli_->post("/admin/ffn", R"({"add":"h:1"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 202);
  EXPECT_EQ(json::parse(r->body)["method"], "POST");
  EXPECT_EQ(json::parse(r->body)["body"], R"({"add":"h:1"})");

  r = cli_->get("/admin/extra");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "extra");
  std::lock_guard<std::mutex> l(backend_.mu);
  EXPECT_EQ(backend_.counted, std::vector<int>({200}));  // /v1/models only
}

TEST_F(ApiServerTest, GenerationIsParsedHereAndRunByTheBackend) {
  start();
  auto r = cli_->post("/v1/completions", R"({"model":"tiny","prompt":"hello","max_tokens":5})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, R"({"ok":true})");
  // Refused here: bad body (400), other model (404), draining (503); none reaches the backend.
  r = cli_->post("/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":0})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  r = cli_->post("/v1/completions", R"({"model":"other","prompt":"x"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  backend_.draining_flag = true;
  r = cli_->post("/v1/completions", R"({"model":"tiny","prompt":"hello"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "7");
  EXPECT_EQ(error_message(r->body), refusal_while_closing(false));

  std::lock_guard<std::mutex> l(backend_.mu);
  ASSERT_EQ(backend_.calls.size(), 1u);
  const auto& c = backend_.calls[0];
  EXPECT_EQ(c.path, "/v1/completions");
  EXPECT_EQ(c.id.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(c.id.size(), 5u + 16u);
  EXPECT_EQ(c.model, "tiny");
  EXPECT_GT(c.prompt_tokens, 0u);
  EXPECT_EQ(c.max_tokens, 5);
  EXPECT_EQ(c.in_flight, 1);  // counted while the backend runs it
  EXPECT_EQ(backend_.in_flight_n.load(), 0);
  EXPECT_EQ(backend_.counted, std::vector<int>({400, 404, 503}));  // the backend counts its own answers
}

TEST_F(ApiServerTest, ApiKeyGuardsV1AndAdminAndCountsV1Refusals) {
  start("sekrit");
  auto r = cli_->get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = cli_->get("/admin/extra");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = cli_->get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = cli_->get("/v1/models", {{"Authorization", "Bearer sekrit"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  std::lock_guard<std::mutex> l(backend_.mu);
  EXPECT_EQ(backend_.counted, std::vector<int>({401, 200}));
}

}  // namespace
}  // namespace afd::serve::test_api_server
