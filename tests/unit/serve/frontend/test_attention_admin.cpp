// AttentionAdmin (serve/frontend/frontend_attention_admin.h): the membership state machine of the front
// end's attention workers without HTTP: add (new slot, or an old slot back), remove (draining
// while requests are in flight, then removed by settle(); "migrate" hands them to the mover),
// the refusals, set() from a list, the router growing with the slots, and the metrics.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/frontend/frontend_attention_admin.h"

namespace afd::serve::test_attention_admin {
namespace {

using json = nlohmann::json;

struct Fixture {
  Fixture() : roster(initial()), router(2, [this](int w) { return (*roster.snapshot())[w]->inflight_tokens.load(); }) {}
  static WorkerList initial() {
    WorkerList ws;
    for (int i = 0; i < 2; ++i) {
      auto w = std::make_shared<FrontendWorker>();
      w->index = i;
      w->address = "127.0.0.1:" + std::to_string(8100 + i);
      w->host = "127.0.0.1";
      w->port = 8100 + i;
      w->set_state(true, "");
      ws.push_back(w);
    }
    return ws;
  }
  std::shared_ptr<FrontendWorker> at(int i) { return (*roster.snapshot())[i]; }
  json get() {
    auto [code, body] = admin.request("GET", "");
    EXPECT_EQ(code, 200) << body;
    return json::parse(body);
  }
  json post(const json& body, int want) {
    auto [code, out] = admin.request("POST", body.dump());
    EXPECT_EQ(code, want) << out;
    return json::parse(out);
  }
  WorkerRoster roster;
  Router router;
  AttentionAdmin admin{&roster, &router, 4};
};

TEST(AttentionAdmin, AddMakesASlotThatIsPlacedOnOnceUp) {
  Fixture f;
  json r = f.post({{"add", "127.0.0.1:8102"}}, 200);
  EXPECT_EQ(r, (json{{"worker", 2}, {"address", "127.0.0.1:8102"}, {"result", "added"}}));
  ASSERT_EQ(f.roster.snapshot()->size(), 3u);
  EXPECT_EQ(f.router.n_workers(), 3);
  auto w = f.at(2);
  EXPECT_EQ(w->port, 8102);
  EXPECT_FALSE(w->placeable());  // the health thread has not checked it yet
  EXPECT_EQ(w->why_down(), "joined: not checked yet");
  w->set_state(true, "");
  EXPECT_TRUE(w->placeable());
  EXPECT_EQ(workers_up(*f.roster.snapshot()), 3);
  json g = f.get();
  ASSERT_EQ(g["workers"].size(), 3u);
  EXPECT_EQ(g["workers"][2]["state"], "up");
  EXPECT_EQ(g["joins"], 1);
  // Refusals change nothing.
  f.post({{"add", "127.0.0.1:8102"}}, 409);
  f.post({{"add", "nohost"}}, 400);
  f.post({{"add", 5}}, 400);
  f.post({{"add", "127.0.0.1:8102"}, {"remove", 0}}, 400);
  f.post(json::array(), 400);
  EXPECT_EQ(f.admin.request("PUT", "{}").first, 405);
  EXPECT_EQ(f.roster.snapshot()->size(), 3u);
  // Slots are bounded (4 here).
  f.post({{"add", "127.0.0.1:8103"}}, 200);
  f.post({{"add", "127.0.0.1:8104"}}, 400);
}

TEST(AttentionAdmin, RemoveDrainsThenSettles) {
  Fixture f;
  auto w0 = f.at(0);
  w0->inflight_requests = 2;
  json r = f.post({{"remove", "127.0.0.1:8100"}}, 200);
  EXPECT_EQ(r["result"], "draining");
  EXPECT_EQ(r["inflight_requests"], 2);
  EXPECT_TRUE(w0->up.load());
  EXPECT_FALSE(w0->placeable());  // up, but nothing new goes there
  EXPECT_TRUE(w0->listed());
  EXPECT_EQ(f.get()["workers"][0]["state"], "draining");
  EXPECT_EQ(f.post({{"remove", 0}}, 200)["result"], "draining");  // again: no change
  EXPECT_EQ(f.admin.settle(), 0);                                 // requests still in flight there
  w0->inflight_requests = 0;
  EXPECT_EQ(f.admin.settle(), 1);
  EXPECT_EQ(w0->membership.load(), Membership::removed);
  EXPECT_FALSE(w0->up.load());
  EXPECT_FALSE(w0->listed());
  json g = f.get();
  ASSERT_EQ(g["workers"].size(), 1u);
  EXPECT_EQ(g["workers"][0]["worker"], 1);
  EXPECT_EQ(g["leaves"], 1);
  f.post({{"remove", 0}}, 404);                 // gone
  f.post({{"remove", "127.0.0.1:8101"}}, 409);  // the last active worker stays
  f.post({{"remove", "127.0.0.1:9"}}, 404);
  // The same address again: its old slot, checked again before it is placed on.
  EXPECT_EQ(f.post({{"add", "127.0.0.1:8100"}}, 200),
            (json{{"worker", 0}, {"address", "127.0.0.1:8100"}, {"result", "active again"}}));
  EXPECT_EQ(w0->membership.load(), Membership::active);
  EXPECT_FALSE(w0->placeable());
  EXPECT_EQ(f.roster.snapshot()->size(), 2u);
}

TEST(AttentionAdmin, RemoveWithNothingInFlightIsImmediate) {
  Fixture f;
  EXPECT_EQ(f.post({{"remove", 1}}, 200)["result"], "removed");
  EXPECT_FALSE(f.at(1)->listed());
  // A draining worker added back stays where it is (no re-check needed: it was never dropped).
  f.at(0)->inflight_requests = 1;
  f.post({{"add", "127.0.0.1:8102"}}, 200);
  f.at(2)->set_state(true, "");
  EXPECT_EQ(f.post({{"remove", 0}}, 200)["result"], "draining");
  EXPECT_EQ(f.post({{"add", "127.0.0.1:8100"}}, 200)["result"], "active again");
  EXPECT_TRUE(f.at(0)->placeable());
  EXPECT_EQ(f.admin.settle(), 0);
}

TEST(AttentionAdmin, MigrateMovesTheRequestsInFlight) {
  Fixture f;
  f.at(0)->inflight_requests = 2;
  // Without a mover (no front end behind it) "migrate" is refused, and nothing changes.
  f.post({{"remove", 0}, {"migrate", true}}, 400);
  EXPECT_EQ(f.at(0)->membership.load(), Membership::active);
  f.post({{"remove", 0}, {"migrate", "yes"}}, 400);
  f.post({{"add", "127.0.0.1:8102"}, {"migrate", true}}, 400);
  std::vector<int> moved;
  f.admin.set_migrate([&](const FrontendWorker& w) {
    moved.push_back(w.index);
    return 2;
  });
  json r = f.post({{"remove", 0}, {"migrate", true}}, 200);
  EXPECT_EQ(r["result"], "draining");
  EXPECT_EQ(r["moved"], 2);
  EXPECT_EQ(moved, std::vector<int>{0});
  // A drain in progress can be hurried the same way; without migrate nothing is moved.
  EXPECT_EQ(f.post({{"remove", 0}}, 200).contains("moved"), false);
  EXPECT_EQ(f.post({{"remove", 0}, {"migrate", true}}, 200)["moved"], 2);
  EXPECT_EQ(moved, (std::vector<int>{0, 0}));
  // Nothing in flight: removed at once, nothing to move.
  f.at(0)->inflight_requests = 0;
  f.admin.settle();
  f.post({{"add", "127.0.0.1:8102"}}, 200);
  r = f.post({{"remove", 1}, {"migrate", true}}, 200);
  EXPECT_EQ(r["result"], "removed");
  EXPECT_FALSE(r.contains("moved"));
  EXPECT_EQ(moved.size(), 2u);
}

TEST(AttentionAdmin, SetAppliesAListAddsFirst) {
  Fixture f;
  auto [code, body] = f.admin.set({"127.0.0.1:8101", "127.0.0.1:8102"}, "test");
  ASSERT_EQ(code, 200) << body;
  EXPECT_EQ(json::parse(body), (json{{"added", {"127.0.0.1:8102"}}, {"removed", {"127.0.0.1:8100"}}}));
  EXPECT_FALSE(f.at(0)->listed());  // nothing was in flight there
  EXPECT_EQ(f.at(2)->membership.load(), Membership::active);
  // Invalid lists change nothing.
  EXPECT_EQ(f.admin.set({}, "test").first, 400);
  EXPECT_EQ(f.admin.set({"127.0.0.1:8100", "bad"}, "test").first, 400);
  EXPECT_EQ(f.admin.set({"127.0.0.1:8100", "127.0.0.1:8100"}, "test").first, 400);
  EXPECT_FALSE(f.at(0)->listed());
  EXPECT_EQ(f.roster.snapshot()->size(), 3u);
  // The same list again: nothing to do.
  std::tie(code, body) = f.admin.set({"127.0.0.1:8101", "127.0.0.1:8102"}, "test");
  EXPECT_EQ(json::parse(body), (json{{"added", json::array()}, {"removed", json::array()}}));
}

TEST(AttentionAdmin, MetricsCountStatesAndChanges) {
  Fixture f;
  f.at(1)->set_state(false, "no answer");
  f.post({{"add", "127.0.0.1:8102"}}, 200);
  f.at(0)->inflight_requests = 1;
  f.post({{"remove", 0}}, 200);
  const std::string m = f.admin.render_metrics();
  EXPECT_NE(m.find("afd_frontend_attention_workers{state=\"up\"} 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_attention_workers{state=\"down\"} 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_attention_workers{state=\"draining\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_attention_workers{state=\"removed\"} 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_attention_membership_changes_total{change=\"join\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("afd_frontend_attention_membership_changes_total{change=\"leave\"} 1\n"), std::string::npos) << m;
}

}  // namespace
}  // namespace afd::serve::test_attention_admin
