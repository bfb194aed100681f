// Which FFN workers an attention worker takes, and stops dialling (FfnClient, FfnWorker,
// protocol v5): an FFN worker that computes with another activation precision (--precision)
// is refused by the handshake on both sides — at start-up, and when added to the membership
// (set_members / add_member fail naming the field and both values, the worker is not added);
// a removed FFN worker's address is no longer dialled, and dialled again once re-added; an FFN
// worker started for x attention workers serves one more that joins later (x is not compared),
// but not a second one with an index it already serves.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <random>
#include <thread>

#include "../../model/model_test_util.h"
#include "../../model/tiny_model.h"
#include "ffn_cluster.h"
#include "comm/inproc_transport.h"
#include "comm/protocol.h"
#include "core/timer.h"
#include "model/tools/make_model.h"
#include "model/weights.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/afd/ffn_worker.h"

namespace afd {
namespace {

using namespace comm;

using test::deadline_in_ms;
using test::wait_until;

// qwen2_moe tiny (8 experts, top-2, shared expert), 2 layers.
std::shared_ptr<const ModelWeights> tiny_model() {
  static const std::shared_ptr<const ModelWeights> cached = test::make_tiny_moe("afd_test_ffn_admission", 2, 5);
  return cached;
}

// test::FfnCluster whose workers each compute with their own activation precision.
struct Cluster : test::FfnCluster {
  using FfnCluster::FfnCluster;
  void start(int j, int n, kernels::ActPrecision prec) {
    FfnWorkerOptions o;
    o.n_ffn = n;
    o.n_attention = 1;
    o.peer_timeout_ms = 500;
    o.prec = prec;
    FfnCluster::start(j, o);
  }
};

FfnClientOptions client_opts(int y, WirePrecision prec) {
  FfnClientOptions o;
  o.ffn_names.clear();
  for (int j = 0; j < y; ++j) {
    o.ffn_names.push_back("ffn" + std::to_string(j));
    o.ffn_addresses.push_back("ffn" + std::to_string(j) + "-addr");
  }
  o.precision = prec;
  o.microbatches = 1;
  o.max_tokens = 16;
  o.timeout_ms = 3000;
  o.connect_timeout_ms = 5000;
  o.probe_interval_ms = 0;
  return o;
}

// One layer-0 pass, retried until it goes through (the scheduler's retry, compressed).
Status pass(FfnClient& cl, const ModelConfig& c, int64_t ms = 10000) {
  TokenBatch b;
  b.resize(c, 3);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  for (auto& v : b.h) v = nd(rng);
  for (int64_t i = 0; i < b.n * c.n_experts_per_tok; ++i) {
    b.topk_ids[i] = static_cast<int32_t>(i % c.n_experts);
    b.topk_w[i] = 0.5f;
  }
  Status s;
  const int64_t dl = deadline_in_ms(ms);
  do {
    s = cl.dispatch(0, 0, b);
    if (s.is_ok()) return cl.combine(0, 0, b);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (now_ns() < dl);
  return s;
}

constexpr const char* kMismatch =
    "precision differs: the attention worker runs --precision reference (f32 activations), the FFN worker "
    "--precision fast (bf16 activations)";

TEST(FfnAdmission, AnFfnWorkerOfAnotherPrecisionIsRefusedAtStart) {
  auto w = tiny_model();
  {
    Cluster c(w);
    c.start(0, 1, kernels::ActPrecision::bf16);
    auto cl = FfnClient::create(w, c.attention("attn0"), client_opts(1, WirePrecision::f32));
    ASSERT_FALSE(cl.ok());
    // The FFN worker refused (its reason comes back in the refuse frame) and counted it.
    EXPECT_NE(cl.status().message().find(kMismatch), std::string::npos) << cl.status().to_string();
    EXPECT_NE(cl.status().message().find("FFN worker 'ffn0'"), std::string::npos) << cl.status().to_string();
    EXPECT_GE(c.ffn[0]->wk->stats().refused.load(), 1);
    EXPECT_EQ(c.ffn[0]->wk->stats().attention_serving.load(), 0);
  }
  {
    // The other way round.
    Cluster c(w);
    c.start(0, 1, kernels::ActPrecision::f32);
    auto cl = FfnClient::create(w, c.attention("attn0"), client_opts(1, WirePrecision::bf16));
    ASSERT_FALSE(cl.ok());
    EXPECT_NE(cl.status().message().find("precision differs: the attention worker runs --precision fast (bf16 "
                                         "activations), the FFN worker --precision reference (f32 activations)"),
              std::string::npos)
        << cl.status().to_string();
  }
  {
    // The same precision on both sides (fast here): taken.
    Cluster c(w);
    c.start(0, 1, kernels::ActPrecision::bf16);
    auto cl = FfnClient::create(w, c.attention("attn0"), client_opts(1, WirePrecision::bf16));
    ASSERT_TRUE(cl.ok()) << cl.status().to_string();
    EXPECT_TRUE(pass(**cl, w->config).is_ok());
  }
}

TEST(FfnAdmission, AddingAnFfnWorkerOfAnotherPrecisionFailsAndLeavesTheMembership) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 1, kernels::ActPrecision::f32);
  c.start(1, 2, kernels::ActPrecision::bf16);
  c.start(2, 3, kernels::ActPrecision::f32);
  FfnClientOptions o = client_opts(1, WirePrecision::f32);
  o.parts = 2;  // room for a second worker
  auto cl = FfnClient::create(w, c.attention("attn0"), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  ASSERT_TRUE(pass(**cl, w->config).is_ok());

  Status s = (*cl)->add_member(FfnMember{"ffn1-addr", ""});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("ffn1-addr"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find(kMismatch), std::string::npos) << s.to_string();
  FfnMembership m = (*cl)->membership();
  ASSERT_EQ(m.members.size(), 2u);
  EXPECT_TRUE(m.members[1].removed);
  EXPECT_FALSE(m.members[1].assigned);
  // It never joins: the monitor leaves the assignment as it was, and passes go on.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*cl)->membership().epoch, m.epoch);
  EXPECT_EQ((*cl)->membership().assigned, 1);
  EXPECT_TRUE(pass(**cl, w->config).is_ok());
  EXPECT_GE(c.ffn[1]->wk->stats().refused.load(), 1);

  // Asking again is refused again (its slot is kept, the check is not skipped).
  s = (*cl)->set_members({FfnMember{"ffn0-addr", ""}, FfnMember{"ffn1-addr", ""}});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find(kMismatch), std::string::npos) << s.to_string();
  EXPECT_TRUE((*cl)->membership().members[1].removed);

  // One of the same precision is taken and joins.
  ASSERT_TRUE((*cl)->add_member(FfnMember{"ffn2-addr", ""}).is_ok());
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().assigned == 2; }));
  EXPECT_TRUE(pass(**cl, w->config).is_ok());
  m = (*cl)->membership();
  ASSERT_EQ(m.members.size(), 3u);
  EXPECT_EQ(m.members[2].name, "ffn2");
  EXPECT_TRUE(m.members[2].assigned);
}

// The same refusal when the worker is not up at the call: it is added unchecked, and its join
// handshake refuses it; it does not join, the others keep serving.
TEST(FfnAdmission, AnFfnWorkerOfAnotherPrecisionThatComesLaterDoesNotJoin) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 1, kernels::ActPrecision::f32);
  FfnClientOptions o = client_opts(1, WirePrecision::f32);
  o.parts = 2;
  o.join_check_ms = 100;
  auto cl = FfnClient::create(w, c.attention("attn0"), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  ASSERT_TRUE((*cl)->add_member(FfnMember{"ffn1-addr", "ffn1"}).is_ok());  // not up yet: unchecked
  c.start(1, 2, kernels::ActPrecision::bf16);
  // Reachable: the monitor lets it join; the next pass's hello is refused (that pass fails and
  // is retried), and the monitor takes it out again.
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().members[1].assigned; }));
  ASSERT_TRUE(pass(**cl, w->config).is_ok());
  EXPECT_GE(c.ffn[1]->wk->stats().refused.load(), 1);
  ASSERT_TRUE(wait_until([&] {
    FfnMembership m = (*cl)->membership();
    return m.assigned == 1 && !m.members[1].assigned;
  }));
  EXPECT_TRUE(pass(**cl, w->config).is_ok());
}

// A removed FFN worker is not dialled again: when it comes back at its address, this attention
// worker does not connect to it (the in-process transport would within 20 ms); added again, it is.
TEST(FfnAdmission, ARemovedFfnWorkerIsNotDialled) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 2, kernels::ActPrecision::f32);
  c.start(1, 2, kernels::ActPrecision::f32);
  Transport* t = c.attention("attn0");
  auto cl = FfnClient::create(w, t, client_opts(2, WirePrecision::f32));
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  ASSERT_TRUE(pass(**cl, w->config).is_ok());
  const PeerId ffn1 = *t->peer_id("ffn1");
  ASSERT_TRUE(t->is_connected(ffn1));

  ASSERT_TRUE((*cl)->remove_member("ffn1").is_ok());
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().assigned == 1; }));
  ASSERT_TRUE(pass(**cl, w->config).is_ok());
  c.kill(1);
  ASSERT_TRUE(wait_until([&] { return !t->is_connected(ffn1); }));
  c.start(1, 2, kernels::ActPrecision::f32);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(t->is_connected(ffn1)) << "the removed FFN worker's address was dialled again";
  EXPECT_EQ(c.ffn[1]->wk->stats().attention_serving.load(), 0);

  // Added again: dialled, checked and joined.
  ASSERT_TRUE((*cl)->add_member(FfnMember{"ffn1-addr", ""}).is_ok());
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().assigned == 2; }));
  EXPECT_TRUE(t->is_connected(ffn1));
  EXPECT_TRUE(pass(**cl, w->config).is_ok());
}

TEST(FfnAdmission, AnAttentionWorkerBeyondXIsServedButNotADuplicateIndex) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 1, kernels::ActPrecision::f32);  // --attention 1
  auto cl0 = FfnClient::create(w, c.attention("attn0"), client_opts(1, WirePrecision::f32));
  ASSERT_TRUE(cl0.ok()) << cl0.status().to_string();
  ASSERT_TRUE(pass(**cl0, w->config).is_ok());
  // Attention worker 1 of 2 joins the running deployment.
  FfnClientOptions o1 = client_opts(1, WirePrecision::f32);
  o1.index = 1;
  o1.n_attention = 2;
  auto cl1 = FfnClient::create(w, c.attention("attn1"), o1);
  ASSERT_TRUE(cl1.ok()) << cl1.status().to_string();
  ASSERT_TRUE(pass(**cl1, w->config).is_ok());
  EXPECT_EQ(c.ffn[0]->wk->stats().attention_serving.load(), 2);
  ASSERT_TRUE(pass(**cl0, w->config).is_ok());  // the first one is still served
  // Another process saying it is index 1 (of 3) is refused while index 1 is served.
  FfnClientOptions o2 = client_opts(1, WirePrecision::f32);
  o2.index = 1;
  o2.n_attention = 3;
  o2.connect_timeout_ms = 2000;
  auto cl2 = FfnClient::create(w, c.attention("attn2"), o2);
  ASSERT_FALSE(cl2.ok());
  EXPECT_NE(cl2.status().message().find("attention index 1 is already served"), std::string::npos)
      << cl2.status().to_string();
  EXPECT_EQ(c.ffn[0]->wk->stats().attention_serving.load(), 2);
}

}  // namespace
}  // namespace afd
