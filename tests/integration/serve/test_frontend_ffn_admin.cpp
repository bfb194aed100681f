// The front end's /admin/ffn (serve/frontend/frontend_ffn_admin.h) against scripted attention workers
// (fake servers answering /health with an instance and /admin/ffn with a membership): a
// change reaches every worker; a worker that was down, or restarts (a new instance), gets the
// whole list before it is placed on; a refusal by the first worker changes nothing; the API key
// guards the endpoint like /v1/*. With /admin/attention (serve/frontend/frontend_attention_admin.h): an
// attention worker added later gets the whole list before it is placed on, a removed one no
// more changes; POST /admin/reload applies a topology file's lists (serve/frontend/frontend_reload.h).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../unit/serve/http_test_client.h"
#include "frontend_test_model.h"
#include "serve/frontend/frontend.h"
#include "serve/http/server.h"

namespace afd::serve {
namespace {

using json = nlohmann::json;

// An attention worker's /health and /admin/ffn; its membership starts as {ffn0 at f0:1}.
class AdminWorker {
 public:
  explicit AdminWorker(const std::string& fingerprint) {
    reset();
    srv_.get("/health", [this, fingerprint](const http::Request&, http::Response& res) {
      std::lock_guard<std::mutex> l(mu_);
      if (!healthy_) {
        res.status = 503;
        res.set_content(R"({"error":{"message":"FFN worker 'ffn0' is not connected"}})", "application/json");
        return;
      }
      res.set_content(json{{"status", "ok"},
                           {"role", "attention"},
                           {"model", "m"},
                           {"model_config", fingerprint},
                           {"instance", instance_}}
                          .dump(),
                      "application/json");
    });
    auto admin = [this](const http::Request& req, http::Response& res) {
      std::lock_guard<std::mutex> l(mu_);
      if (req.method == "POST") {
        posts_.push_back(req.body);
        authorization_ = req.get_header_value("Authorization");
        if (refuse_) {
          res.status = 404;
          res.set_content(R"({"error":{"message":"no member at or named 'x'"}})", "application/json");
          return;
        }
        json j = json::parse(req.body);
        if (j.contains("add")) {
          members_.push_back({{"address", j["add"]}, {"name", ""}, {"removed", false}});
        } else if (j.contains("remove")) {
          for (auto& m : members_)
            if (m["address"] == j["remove"] || m["name"] == j["remove"]) m["removed"] = true;
        } else {
          members_ = json::array();
          for (const auto& m : j["members"])
            members_.push_back({{"address", m["address"]}, {"name", m.value("name", "")}, {"removed", false}});
        }
      }
      res.set_content(json{{"engines", json::array({{{"epoch", 1}, {"members", members_}}})}}.dump(),
                      "application/json");
    };
    srv_.get("/admin/ffn", admin);
    srv_.post("/admin/ffn", admin);
    auto bound = srv_.bind();
    port_ = bound.ok() ? *bound : -1;
    thread_ = std::thread([this] { (void)srv_.run(); });
  }
  ~AdminWorker() {
    srv_.stop();
    thread_.join();
  }
  // A new process at the same address: the start-up membership, another instance.
  void reset() {
    std::lock_guard<std::mutex> l(mu_);
    members_ = json::array({{{"address", "f0:1"}, {"name", "ffn0"}, {"removed", false}}});
    instance_ = "instance" + std::to_string(++lives_);
  }
  void set_healthy(bool h) {
    std::lock_guard<std::mutex> l(mu_);
    healthy_ = h;
  }
  void set_refuse(bool r) {
    std::lock_guard<std::mutex> l(mu_);
    refuse_ = r;
  }
  std::vector<std::string> posts() {
    std::lock_guard<std::mutex> l(mu_);
    return posts_;
  }
  json members() {
    std::lock_guard<std::mutex> l(mu_);
    return members_;
  }
  std::string authorization() {
    std::lock_guard<std::mutex> l(mu_);
    return authorization_;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  http::Server srv_{http::Options{}};
  int port_ = -1;
  std::thread thread_;
  std::mutex mu_;
  json members_;
  std::string instance_;
  int lives_ = 0;
  bool healthy_ = true, refuse_ = false;
  std::vector<std::string> posts_;
  std::string authorization_;
};

class FrontendFfnAdmin : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = frontend_model_dir("ffn_admin");
    ASSERT_FALSE(dir_.empty());
    for (int i = 0; i < 2; ++i) workers_.push_back(std::make_unique<AdminWorker>(frontend_model_fingerprint(dir_)));
  }
  void TearDown() override {
    if (fe_) fe_->stop();
    if (run_.valid()) run_.wait();
    fe_.reset();
    workers_.clear();
    std::filesystem::remove_all(dir_);
  }
  void start(const std::string& api_key = "", int want_up = 2) {
    FrontendOptions fo;
    fo.server.port = 0;
    fo.server.api_key = api_key;
    fo.model_dir = dir_;
    fo.model_name = "m";
    fo.health_interval_ms = 20;
    fo.federate = false;
    fo.topology_file = topology_file_;
    for (const auto& w : workers_) fo.workers.push_back(w->address());
    auto f = Frontend::create(fo);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    fe_ = std::move(*f);
    ASSERT_TRUE(fe_->start().is_ok());
    Frontend* raw = fe_.get();
    run_ = std::async(std::launch::async, [raw] { return raw->run(); });
    ASSERT_TRUE(wait_for([&] { return fe_->workers_up() == want_up; })) << fe_->why_workers_down();
    cli_ = std::make_unique<testing::TestClient>("127.0.0.1", fe_->port());
  }
  static bool wait_for(const std::function<bool()>& cond) {
    for (int i = 0; i < 1000; ++i) {
      if (cond()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return cond();
  }
  std::optional<testing::HttpResult> admin(const std::string& body, const http::Headers& h = {}) {
    return cli_->post("/admin/ffn", body, h);
  }
  std::optional<testing::HttpResult> attention(const std::string& body, const http::Headers& h = {}) {
    return cli_->post("/admin/attention", body, h);
  }
  // A topology file naming these attention workers and FFN addresses.
  void write_topology(const std::vector<std::string>& attention, const std::vector<std::string>& ffn) {
    json t = {{"model", dir_}, {"attention", json::array()}, {"ffn", json::array()}};
    for (const auto& a : attention) t["attention"].push_back({{"address", a}});
    for (const auto& a : ffn) t["ffn"].push_back({{"address", a}});
    std::ofstream(topology_file_) << t.dump();
  }
  static json live(const json& members) {
    json out = json::array();
    for (const auto& m : members)
      if (!m["removed"].get<bool>()) out.push_back(m["address"]);
    return out;
  }

  std::string dir_;
  std::string topology_file_;  // fo.topology_file when not empty
  std::vector<std::unique_ptr<AdminWorker>> workers_;
  std::unique_ptr<Frontend> fe_;
  std::future<Status> run_;
  std::unique_ptr<testing::TestClient> cli_;
};

TEST_F(FrontendFfnAdmin, AChangeReachesEveryWorkerAndARestartedOneGetsTheWholeList) {
  start();
  auto r = admin(R"({"add": "f1:1"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json a = json::parse(r->body);
  EXPECT_EQ(a["members"], json::parse(R"([{"address": "f0:1", "name": "ffn0"}, {"address": "f1:1"}])"));
  EXPECT_EQ(a["changes"], 1);
  for (const auto& w : a["workers"]) EXPECT_EQ(w["result"], "applied") << a.dump();
  for (auto& w : workers_) {
    EXPECT_EQ(w->posts(), std::vector<std::string>{R"({"add": "f1:1"})"});
    EXPECT_EQ(live(w->members()), json::parse(R"(["f0:1", "f1:1"])"));
  }
  r = admin(R"({"remove": "ffn0"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["members"], json::parse(R"([{"address": "f1:1"}])"));

  // Worker 1 restarts: its start-up list again, a new instance. The front end gives it the
  // whole list (worker 0, which has it, gets nothing more).
  workers_[1]->reset();
  ASSERT_TRUE(wait_for([&] { return workers_[1]->posts().size() == 3; }));
  EXPECT_EQ(json::parse(workers_[1]->posts()[2]), json::parse(R"({"members": [{"address": "f1:1"}]})"));
  EXPECT_EQ(live(workers_[1]->members()), json::parse(R"(["f1:1"])"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(workers_[0]->posts().size(), 2u);
  EXPECT_EQ(workers_[1]->posts().size(), 3u);
  const std::string m = fe_->render_metrics();
  EXPECT_NE(m.find("afd_frontend_ffn_membership_changes_total{result=\"applied\"} 2"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_ffn_members 1"), std::string::npos) << m;
  EXPECT_NE(
      m.find("afd_frontend_ffn_membership_pushes_total{worker=\"1\",address=\"" + workers_[1]->address() + "\"} 1"),
      std::string::npos)
      << m;

  // GET: the list and each worker's membership.
  auto g = cli_->get("/admin/ffn");
  ASSERT_TRUE(g);
  ASSERT_EQ(g->status, 200);
  const json got = json::parse(g->body);
  EXPECT_EQ(got["members"], json::parse(R"([{"address": "f1:1"}])"));
  ASSERT_EQ(got["workers"].size(), 2u);
  EXPECT_TRUE(got["workers"][1]["current"].get<bool>());
  EXPECT_EQ(got["workers"][1]["membership"]["epoch"], 1);
}

TEST_F(FrontendFfnAdmin, AWorkerDownAtTheChangeGetsTheListBeforeItIsPlacedOn) {
  workers_[1]->set_healthy(false);
  start("", 1);
  ASSERT_TRUE(wait_for([&] { return fe_->why_workers_down().find("not connected") != std::string::npos; }))
      << fe_->why_workers_down();
  auto r = admin(R"({"add": "f1:1"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json a = json::parse(r->body);
  EXPECT_EQ(a["workers"][0]["result"], "applied");
  EXPECT_EQ(a["workers"][1]["result"], "later");
  EXPECT_NE(a["workers"][1]["error"].get<std::string>().find("not connected"), std::string::npos) << a.dump();
  EXPECT_TRUE(workers_[1]->posts().empty());
  // It refuses the list at first: it stays down, saying why; then takes it and is up.
  workers_[1]->set_refuse(true);
  workers_[1]->set_healthy(true);
  ASSERT_TRUE(wait_for([&] {
    return fe_->why_workers_down().find("could not give it the FFN membership") != std::string::npos;
  })) << fe_->why_workers_down();
  EXPECT_EQ(fe_->workers_up(), 1);
  workers_[1]->set_refuse(false);
  ASSERT_TRUE(wait_for([&] { return fe_->workers_up() == 2; })) << fe_->why_workers_down();
  EXPECT_EQ(live(workers_[1]->members()), json::parse(R"(["f0:1", "f1:1"])"));
}

TEST_F(FrontendFfnAdmin, ARefusalByTheFirstWorkerChangesNothing) {
  start();
  workers_[0]->set_refuse(true);
  auto r = admin(R"({"remove": "x"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_NE(r->body.find("attention worker 0 at " + workers_[0]->address() + ": no member"), std::string::npos)
      << r->body;
  EXPECT_TRUE(workers_[1]->posts().empty());
  r = admin("[1]");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const std::string m = fe_->render_metrics();
  EXPECT_NE(m.find("afd_frontend_ffn_membership_changes_total{result=\"refused\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_ffn_members 0"), std::string::npos) << m;
}

TEST_F(FrontendFfnAdmin, GuardedByTheApiKeyLikeTheApi) {
  start("sekret");
  auto r = admin(R"({"add": "f1:1"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  auto g = cli_->get("/admin/ffn");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 401);
  EXPECT_TRUE(workers_[0]->posts().empty());
  r = admin(R"({"add": "f1:1"})", {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(workers_[0]->authorization(), "Bearer sekret");
  // /admin/attention and /admin/reload the same way.
  r = attention(R"({"add": "127.0.0.1:9"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  g = cli_->get("/admin/attention");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 401);
  r = cli_->post("/admin/reload", "");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  g = cli_->get("/admin/attention", {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 200) << g->body;
  EXPECT_EQ(json::parse(g->body)["workers"].size(), 2u);
  r = cli_->post("/admin/reload", "", {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;  // no topology file
}

TEST_F(FrontendFfnAdmin, AnAttentionWorkerAddedLaterGetsTheListAndARemovedOneNoChanges) {
  start();
  auto r = admin(R"({"add": "f1:1"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  workers_.push_back(std::make_unique<AdminWorker>(frontend_model_fingerprint(dir_)));
  r = attention(json{{"add", workers_[2]->address()}}.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["worker"], 2);
  // Up only once it holds the membership set through /admin/ffn: the whole list, once.
  ASSERT_TRUE(wait_for([&] { return fe_->workers_up() == 3; })) << fe_->why_workers_down();
  ASSERT_EQ(workers_[2]->posts().size(), 1u);
  EXPECT_EQ(json::parse(workers_[2]->posts()[0]),
            json::parse(R"({"members": [{"address": "f0:1", "name": "ffn0"}, {"address": "f1:1"}]})"));
  auto g = cli_->get("/admin/ffn");
  ASSERT_TRUE(g);
  EXPECT_EQ(json::parse(g->body)["workers"].size(), 3u);

  // Worker 0 leaves (nothing in flight: at once); the next change goes to 1 and 2 only.
  r = attention(R"({"remove": 0})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["result"], "removed");
  r = admin(R"({"remove": "ffn0"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json a = json::parse(r->body);
  ASSERT_EQ(a["workers"].size(), 2u) << a.dump();
  EXPECT_EQ(a["workers"][0]["worker"], 1);
  EXPECT_EQ(a["workers"][1]["worker"], 2);
  EXPECT_EQ(workers_[0]->posts().size(), 1u);
  EXPECT_EQ(live(workers_[2]->members()), json::parse(R"(["f1:1"])"));
  EXPECT_EQ(fe_->workers_up(), 2);
  g = cli_->get("/health");
  ASSERT_TRUE(g);
  EXPECT_EQ(json::parse(g->body)["workers"], 2) << g->body;
  const std::string m = fe_->render_metrics();
  EXPECT_EQ(m.find("afd_frontend_worker_up{worker=\"0\""), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_worker_up{worker=\"2\",address=\"" + workers_[2]->address() + "\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("afd_frontend_attention_workers{state=\"removed\"} 1"), std::string::npos) << m;
}

TEST_F(FrontendFfnAdmin, ATopologyFileReloadAppliesItsListsAndAnInvalidOneNothing) {
  topology_file_ = dir_ + "/topology.json";
  write_topology({workers_[0]->address(), workers_[1]->address()}, {"f0:1"});
  start();
  workers_.push_back(std::make_unique<AdminWorker>(frontend_model_fingerprint(dir_)));
  // Unchanged: nothing to do.
  auto r = cli_->post("/admin/reload", "");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body), json::parse(R"({"attention": {"added": [], "removed": []}, "ffn": "unchanged"})"));
  // Worker 0 out, worker 2 in, an FFN worker more.
  write_topology({workers_[1]->address(), workers_[2]->address()}, {"f0:1", "f1:1"});
  r = cli_->post("/admin/reload", "");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json a = json::parse(r->body);
  EXPECT_EQ(a["attention"]["added"], json::array({workers_[2]->address()}));
  EXPECT_EQ(a["attention"]["removed"], json::array({workers_[0]->address()}));
  EXPECT_EQ(a["ffn"]["members"], json::parse(R"([{"address": "f0:1"}, {"address": "f1:1"}])")) << a.dump();
  ASSERT_TRUE(wait_for([&] { return fe_->workers_up() == 2 && live(workers_[2]->members()).size() == 2; }))
      << fe_->why_workers_down();
  EXPECT_EQ(live(workers_[1]->members()), json::parse(R"(["f0:1", "f1:1"])"));
  EXPECT_TRUE(workers_[0]->posts().empty());  // it had left
  // A file that does not parse, or names no attention worker: 400, nothing changes.
  std::ofstream(topology_file_) << "{";
  r = cli_->post("/admin/reload", "");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  write_topology({}, {"f0:1"});
  r = cli_->post("/admin/reload", "");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  auto g = cli_->get("/admin/attention");
  ASSERT_TRUE(g);
  const json ws = json::parse(g->body)["workers"];
  ASSERT_EQ(ws.size(), 2u) << g->body;
  EXPECT_EQ(ws[0]["worker"], 1);
  EXPECT_EQ(ws[1]["worker"], 2);
  // Reload is fo.topology_file's; the SIGHUP path calls the same reload().
  EXPECT_EQ(fe_->reload("test").first, 400);
}

}  // namespace
}  // namespace afd::serve
