// FFN worker loss that persists and FFN membership changes (FfnClient membership, protocol
// v4 assignment epochs and parts, FfnWorker re-homing): an FFN worker that stays gone has its
// experts taken over by the others after takeover_ms; it rejoins and the experts are
// rebalanced; set_members adds and removes workers, beyond the parts as standbys. Throughout,
// the results equal the monolithic engine's with the rounding of the P-part bundle bit for
// bit (LocalFfnBackend, --afd-rounding P): a worker holding several parts replies one BF16
// partial per part. A frame of another assignment epoch is refused with an error frame; TP
// workers keep their shards; an in-process bundle survives a failed FFN worker thread.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <thread>

#include "../../model/model_test_util.h"
#include "../../model/tiny_model.h"
#include "ffn_cluster.h"
#include "comm/fault_transport.h"
#include "comm/inproc_transport.h"
#include "comm/protocol.h"
#include "core/timer.h"
#include "kernels/cpu/ops.h"
#include "model/fingerprint.h"
#include "model/tools/make_model.h"
#include "model/weights.h"
#include "runtime/bundle.h"
#include "runtime/engine_factory.h"
#include "runtime/ffn_backend.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/afd/ffn_worker.h"

namespace afd {
namespace {

using namespace comm;

using test::deadline_in_ms;
using test::random_batch;
using test::wait_until;

// qwen2_moe tiny (8 experts, top-2, shared expert), 3 layers with layer 1 dense.
std::shared_ptr<const ModelWeights> tiny_model() {
  static const std::shared_ptr<const ModelWeights> cached = test::make_tiny_moe("afd_test_ffn_failover", 3, 3, {1});
  return cached;
}

// test::FfnCluster whose workers expect x attention workers and time a silent peer out after
// 500 ms.
struct Cluster : test::FfnCluster {
  using FfnCluster::FfnCluster;
  // Starts FFN worker j of n (its start-up shard j/n), TP degree tp.
  void start(int j, int n, int tp = 1, bool fault_wrap = false) {
    FfnWorkerOptions o;
    o.n_ffn = n;
    o.n_attention = x;
    o.peer_timeout_ms = 500;
    o.tp = tp;
    FfnCluster::start(j, o, fault_wrap);
  }
  int x = 1;  // attention workers the FFN workers expect
};

FfnClientOptions client_opts(int y) {
  FfnClientOptions o;
  o.ffn_names.clear();
  for (int j = 0; j < y; ++j) {
    o.ffn_names.push_back("ffn" + std::to_string(j));
    o.ffn_addresses.push_back("ffn" + std::to_string(j) + "-addr");
  }
  o.microbatches = 2;
  o.max_tokens = 32;
  o.timeout_ms = 3000;
  o.connect_timeout_ms = 5000;
  o.probe_interval_ms = 0;
  return o;
}

// One forward pass through the client (every layer, two micro-batches) against the
// monolithic engine's FFN with the rounding of an n-part bundle (--afd-rounding n: FP8 input,
// each part's partial rounded to BF16, summed in part order): equal bit for bit.
void expect_pass_equals_mono(FfnClient& cl, std::shared_ptr<const ModelWeights> w, int n, uint32_t seed) {
  LocalFfnOptions lo;
  lo.fp8_dispatch = true;
  lo.combine_shards = n;
  LocalFfnBackend mono(w, lo, nullptr);
  const ModelConfig& c = w->config;
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    TokenBatch b[2] = {random_batch(c, 5, seed * 100 + static_cast<uint32_t>(layer)),
                       random_batch(c, 3, seed * 100 + 50 + static_cast<uint32_t>(layer))};
    for (int mb = 0; mb < 2; ++mb) {
      Status d = cl.dispatch(layer, mb, b[mb]);
      ASSERT_TRUE(d.is_ok()) << "layer " << layer << " mb " << mb << ": " << d.to_string();
    }
    for (int mb = 0; mb < 2; ++mb) {
      Status s = cl.combine(layer, mb, b[mb]);
      ASSERT_TRUE(s.is_ok()) << "layer " << layer << " mb " << mb << ": " << s.to_string();
      TokenBatch ref = b[mb];
      ASSERT_TRUE(mono.dispatch(layer, mb, ref).is_ok());
      for (int64_t i = 0; i < ref.n * c.hidden_size; ++i)
        ASSERT_EQ(b[mb].ffn_out[i], ref.ffn_out[i]) << "layer " << layer << " mb " << mb << " element " << i;
    }
  }
}

// Dispatches layer 0 of a new pass until it succeeds (the scheduler's retry, compressed).
Status pass_starts(FfnClient& cl, const ModelConfig& c, int64_t ms = 10000) {
  TokenBatch t = random_batch(c, 2, 7);
  Status s;
  const int64_t dl = deadline_in_ms(ms);
  do {
    s = cl.dispatch(0, 0, t);
    if (s.is_ok()) return cl.combine(0, 0, t);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (now_ns() < dl);
  return s;
}

TEST(FfnFailover, SurvivorsTakeOverALostWorkersExpertsThenRebalanceWhenItReturns) {
  auto w = tiny_model();
  Cluster c(w);
  for (int j = 0; j < 3; ++j) c.start(j, 3);
  FfnClientOptions o = client_opts(3);
  o.takeover_ms = 1000;
  auto cl = FfnClient::create(w, c.attention("attn0"), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  EXPECT_EQ((*cl)->membership().epoch, 0u);
  expect_pass_equals_mono(**cl, w, 3, 1);

  const int64_t t_kill = now_ns();
  c.kill(1);
  // Until the takeover, /health says who is missing and when the others take over (unless
  // this thread was descheduled for the whole takeover time).
  Status h;
  ASSERT_TRUE(wait_until([&] { return !(h = (*cl)->health()).is_ok() || (*cl)->membership().epoch > 0; }));
  if (!h.is_ok()) {
    EXPECT_EQ(h.code(), StatusCode::unavailable);
    EXPECT_NE(h.message().find("FFN worker 'ffn1' is not connected (the other FFN workers take over its experts in"),
              std::string::npos)
        << h.to_string();
  }
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().epoch == 1 && (*cl)->health().is_ok(); }))
      << (*cl)->health().to_string();
  EXPECT_GE(now_ns() - t_kill, int64_t{1000} * 1000000);  // not before takeover_ms
  FfnMembership m = (*cl)->membership();
  EXPECT_EQ(m.takeovers, 1);
  EXPECT_EQ(m.assigned, 2);
  ASSERT_EQ(m.members.size(), 3u);
  EXPECT_FALSE(m.members[1].assigned);
  EXPECT_FALSE(m.members[1].connected);
  EXPECT_GT(m.members[1].unreachable_ms, 0);
  // The survivors split the 3 parts: ffn0 part 0 (experts [0, 2) + shared), ffn2 parts 1 and 2
  // (experts [2, 8)), each part still rounded on its own: the 3-part results, bit for bit.
  EXPECT_EQ(m.parts, 3);
  EXPECT_EQ(m.members[0].expert_begin, 0);
  EXPECT_EQ(m.members[0].expert_end, 2);
  EXPECT_TRUE(m.members[0].holds_shared);
  EXPECT_EQ(m.members[2].expert_begin, 2);
  EXPECT_EQ(m.members[2].expert_end, 8);
  EXPECT_EQ(m.members[2].part_begin, 1);
  EXPECT_EQ(m.members[2].part_end, 3);
  expect_pass_equals_mono(**cl, w, 3, 2);
  EXPECT_EQ((*cl)->membership().applied_epoch, 1u);
  EXPECT_EQ((*cl)->last_sent_tokens(0, 1), 0);
  EXPECT_EQ((*cl)->ffn_handshake(2).epoch, 1u);
  EXPECT_EQ(c.ffn[2]->wk->stats().held_experts.load(), 6);  // was [5, 8)
  EXPECT_GE(c.ffn[2]->wk->stats().reassignments.load(), 1);

  // The worker comes back (same name and address): it joins, the experts are rebalanced.
  c.start(1, 3);
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().epoch == 2 && (*cl)->membership().assigned == 3; }));
  expect_pass_equals_mono(**cl, w, 3, 3);
  m = (*cl)->membership();
  EXPECT_EQ(m.rejoins, 1);
  EXPECT_EQ(m.members[1].expert_begin, 2);
  EXPECT_EQ(m.members[1].expert_end, 5);
  EXPECT_GT((*cl)->last_sent_tokens(0, 1) + (*cl)->last_sent_tokens(1, 1), 0);
}

// An attention worker (re)started while an FFN worker of its list is gone for good does not
// wait for it past the takeover time: it starts with the others holding every expert, and
// the missing one joins when it comes.
TEST(FfnFailover, StartsWithoutAWorkerThatDoesNotComeWithinTheTakeoverTime) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 3);
  c.start(2, 3);
  FfnClientOptions o = client_opts(3);
  o.takeover_ms = 300;
  o.connect_timeout_ms = 20000;
  const int64_t t0 = now_ns();
  auto cl = FfnClient::create(w, c.attention("attn0"), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  EXPECT_GE(now_ns() - t0, int64_t{300} * 1000000);
  FfnMembership m = (*cl)->membership();
  EXPECT_EQ(m.epoch, 1u);
  EXPECT_EQ(m.assigned, 2);
  EXPECT_EQ(m.takeovers, 1);
  EXPECT_FALSE(m.members[1].assigned);
  EXPECT_TRUE((*cl)->health().is_ok()) << (*cl)->health().to_string();
  expect_pass_equals_mono(**cl, w, 3, 11);
  c.start(1, 3);
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().assigned == 3; }));
  expect_pass_equals_mono(**cl, w, 3, 12);
  // Without a takeover time it is an error naming the missing worker, as before.
  Cluster c2(w);
  c2.start(0, 2);
  FfnClientOptions o2 = client_opts(2);
  o2.connect_timeout_ms = 300;
  auto cl2 = FfnClient::create(w, c2.attention("attn0"), o2);
  ASSERT_FALSE(cl2.ok());
  EXPECT_NE(cl2.status().message().find("'ffn1' at ffn1-addr did not connect within 300 ms"), std::string::npos)
      << cl2.status().to_string();
}

// A worker that is connected but silent (a stopped process) is unreachable too: with
// liveness probes, the others take over once its pong is overdue for takeover_ms, and it
// rejoins when it answers again.
TEST(FfnFailover, AStalledWorkerIsTakenOverAndRejoinsWhenItAnswers) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 2);
  c.start(1, 2, 1, /*fault_wrap=*/true);
  FfnClientOptions o = client_opts(2);
  o.takeover_ms = 500;
  o.probe_interval_ms = 50;
  o.timeout_ms = 300;
  auto cl = FfnClient::create(w, c.attention("attn0"), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  expect_pass_equals_mono(**cl, w, 2, 4);
  c.ffn[1]->fault->set_stall(true);
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().epoch == 1 && (*cl)->health().is_ok(); }))
      << (*cl)->health().to_string();
  EXPECT_EQ((*cl)->membership().takeovers, 1);
  expect_pass_equals_mono(**cl, w, 2, 5);  // ffn0 holds both parts
  c.ffn[1]->fault->set_stall(false);
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().epoch == 2 && (*cl)->membership().assigned == 2; }));
  // The first pass after the rebalance may meet the stalled pass's late reply: dropped.
  expect_pass_equals_mono(**cl, w, 2, 6);
}

TEST(FfnFailover, SetMembersAddsAndRemovesWorkers) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 2);
  c.start(1, 2);
  c.start(2, 3);  // started as shard 2/3; its start-up shard does not matter once it is assigned
  c.start(3, 4);
  FfnClientOptions o = client_opts(2);
  o.parts = 3;  // room for a third worker
  auto cl = FfnClient::create(w, c.attention("attn0"), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  // Three parts over two workers from the first pass on: epoch 1.
  FfnMembership m = (*cl)->membership();
  EXPECT_EQ(m.epoch, 1u);
  EXPECT_EQ(m.members[1].part_begin, 1);
  EXPECT_EQ(m.members[1].part_end, 3);
  expect_pass_equals_mono(**cl, w, 3, 7);

  // Added by address alone: its name is learned when it connects.
  ASSERT_TRUE((*cl)->add_member(FfnMember{"ffn2-addr", ""}).is_ok());
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().assigned == 3; }));
  m = (*cl)->membership();
  EXPECT_EQ(m.epoch, 2u);
  EXPECT_EQ(m.members[2].name, "ffn2");
  EXPECT_EQ(m.rejoins, 1);
  expect_pass_equals_mono(**cl, w, 3, 8);

  // A fourth: every part is held, so it waits as a standby (connected, not assigned).
  ASSERT_TRUE((*cl)->add_member(FfnMember{"ffn3-addr", "ffn3"}).is_ok());
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().members.size() == 4 && (*cl)->membership().members[3].connected; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  m = (*cl)->membership();
  EXPECT_EQ(m.epoch, 2u);
  EXPECT_FALSE(m.members[3].assigned);

  // Removing the shared holder: the standby joins, the next one in slot order takes part 0.
  ASSERT_TRUE((*cl)->remove_member("ffn0").is_ok());
  ASSERT_TRUE(wait_until([&] { return (*cl)->membership().epoch == 3; }));
  m = (*cl)->membership();
  EXPECT_TRUE(m.members[0].removed);
  EXPECT_FALSE(m.members[0].assigned);
  EXPECT_TRUE(m.members[1].holds_shared);
  EXPECT_TRUE(m.members[3].assigned);
  EXPECT_EQ(m.leaves, 1);
  expect_pass_equals_mono(**cl, w, 3, 9);
  EXPECT_EQ((*cl)->last_sent_tokens(0, 0), 0);

  // Bad requests are errors naming the problem, and change nothing.
  EXPECT_EQ((*cl)->set_members({}).code(), StatusCode::invalid_argument);
  Status dup = (*cl)->set_members({FfnMember{"ffn1-addr", ""}, FfnMember{"ffn1-addr", ""}});
  EXPECT_NE(dup.message().find("listed twice"), std::string::npos) << dup.to_string();
  Status taken = (*cl)->set_members({FfnMember{"ffn1-addr", ""}, FfnMember{"elsewhere", "ffn1"}});
  EXPECT_EQ(taken.code(), StatusCode::invalid_argument) << taken.to_string();
  EXPECT_EQ((*cl)->remove_member("nobody").code(), StatusCode::not_found);
  EXPECT_EQ((*cl)->membership().epoch, 3u);

  // Listed again, the removed worker gets its slot back (as a standby: all parts are held).
  ASSERT_TRUE((*cl)->set_members({FfnMember{"ffn0-addr", ""}, FfnMember{"ffn1-addr", ""},
                                  FfnMember{"ffn2-addr", ""}, FfnMember{"ffn3-addr", ""}})
                  .is_ok());
  ASSERT_TRUE(wait_until([&] { return !(*cl)->membership().members[0].removed; }));
  EXPECT_EQ((*cl)->membership().members.size(), 4u);
  EXPECT_FALSE((*cl)->membership().members[0].assigned);
  expect_pass_equals_mono(**cl, w, 3, 10);
}

// Two attention workers mid-change hold different assignments on the same FFN worker: one
// moved to epoch 1 (ffn0 holds both parts), the other still at epoch 0. The FFN worker
// computes each assignment apart; both get the 2-part results.
TEST(FfnFailover, AttentionWorkersInDifferentEpochsAreServedTogether) {
  auto w = tiny_model();
  Cluster c(w);
  c.x = 2;
  c.start(0, 2);
  c.start(1, 2);
  std::vector<std::unique_ptr<FfnClient>> cls;
  for (int a = 0; a < 2; ++a) {
    FfnClientOptions o = client_opts(2);
    o.index = a;
    o.n_attention = 2;
    auto cl = FfnClient::create(w, c.attention("attn" + std::to_string(a)), o);
    ASSERT_TRUE(cl.ok()) << cl.status().to_string();
    cls.push_back(std::move(*cl));
  }
  ASSERT_TRUE(cls[0]->remove_member("ffn1").is_ok());
  ASSERT_TRUE(wait_until([&] { return cls[0]->membership().epoch == 1; }));
  std::atomic<int> step{0};
  std::vector<std::thread> ts;
  for (int a = 0; a < 2; ++a) {
    ts.emplace_back([&, a] {
      for (int k = 0; k < 4; ++k) {
        step++;
        while (step.load() < 2 * (k + 1)) std::this_thread::yield();  // both start each pass together
        expect_pass_equals_mono(*cls[static_cast<size_t>(a)], w, 2, 20 + static_cast<uint32_t>(10 * a + k));
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(cls[0]->last_sent_tokens(0, 1), 0);
  EXPECT_GT(c.ffn[1]->wk->stats().frames.load(), 0);  // attention 1 still uses ffn1
}

// Without a survivor nothing moves: a 1A1F bundle whose FFN worker is gone waits for it,
// and /health says just that.
TEST(FfnFailover, NoTakeoverWithoutASurvivor) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 1);
  FfnClientOptions o = client_opts(1);
  o.takeover_ms = 100;
  auto cl = FfnClient::create(w, c.attention("attn0"), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  c.kill(0);
  ASSERT_TRUE(wait_until([&] { return !(*cl)->health().is_ok(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*cl)->health().message(), "FFN worker 'ffn0' is not connected");
  EXPECT_EQ((*cl)->membership().epoch, 0u);
  c.start(0, 1);
  EXPECT_TRUE(pass_starts(**cl, w->config).is_ok());
  EXPECT_EQ((*cl)->membership().epoch, 0u);
}

// Builds an a2f frame of n tokens (layer 0, micro-batch 0) for `epoch` in buf.
size_t a2f_frame(const ModelConfig& c, std::vector<uint64_t>* buf, uint32_t epoch, uint64_t step) {
  const int64_t n = 2, H = c.hidden_size, K = c.n_experts_per_tok;
  auto lay = a2f_layout(n, H, K, ScaleGranularity::per_token);
  EXPECT_TRUE(lay.ok());
  buf->assign((kFrameHeaderBytes + lay->total) / 8 + 1, 0);
  auto* base = reinterpret_cast<uint8_t*>(buf->data());
  uint8_t* p = base + kFrameHeaderBytes;
  TokenBatch b = random_batch(c, n, 42);
  for (int64_t r = 0; r < n; ++r) {
    kernels::quantize_fp8_e4m3(b.h.data() + r * H, H, H, p + lay->q + r * H,
                               reinterpret_cast<float*>(p + lay->scales) + r);
  }
  std::memcpy(p + lay->ids, b.topk_ids.data(), static_cast<size_t>(n * K) * 4);
  std::memcpy(p + lay->weights, b.topk_w.data(), static_cast<size_t>(n * K) * 4);
  FrameHeader h;
  h.kind = FrameKind::a2f;
  h.granularity = ScaleGranularity::per_token;
  h.step = step;
  h.n_tokens = static_cast<uint32_t>(n);
  h.hidden = static_cast<uint32_t>(H);
  h.top_k = static_cast<uint32_t>(K);
  h.epoch = epoch;
  h.payload_bytes = lay->total;
  encode_header(h, p, base);
  return kFrameHeaderBytes + lay->total;
}

// The attention side of the wire by hand: hello with an explicit assignment, frames of the
// right and of another epoch.
struct RawAttention {
  Transport* t;
  PeerId peer;
  std::vector<uint64_t> out = std::vector<uint64_t>(1024), in = std::vector<uint64_t>(1024);
  uint8_t* out8() { return reinterpret_cast<uint8_t*>(out.data()); }
  uint8_t* in8() { return reinterpret_cast<uint8_t*>(in.data()); }
  // Sends `len` bytes of out on `tag` and receives one message on `reply_tag`.
  Result<size_t> exchange(size_t len, uint64_t tag, uint64_t reply_tag) {
    AFD_ASSIGN_OR_RETURN(RequestId r, t->post_recv(peer, reply_tag, in8(), in.size() * 8));
    AFD_ASSIGN_OR_RETURN(RequestId s, t->post_send(peer, tag, out8(), len));
    Completion cs = t->wait(s, deadline_in_ms(5000));
    if (!cs.status.is_ok()) return cs.status;
    Completion cr = t->wait(r, deadline_in_ms(5000));
    if (!cr.status.is_ok()) return cr.status;
    return cr.bytes;
  }
  Result<Handshake> hello(const Handshake& h) {
    size_t len = encode_handshake(FrameKind::hello, h, out8());
    const uint64_t tag = frame_tag(TagFamily::handshake, 0);
    AFD_ASSIGN_OR_RETURN(size_t got, exchange(len, tag, tag));
    return decode_handshake(in8(), got, FrameKind::hello_ack);
  }
};

// A hello for `epoch` asking for parts [begin, end) of n_parts (epoch 0: none).
Handshake attention_hello(const ModelWeights& w, uint32_t epoch, uint16_t n_parts, uint16_t begin, uint16_t end) {
  const ModelConfig& c = w.config;
  Handshake h;
  h.fingerprint = model_fingerprint(w);
  h.role = Role::attention;
  h.n_attention = 1;
  h.n_ffn = 1;
  h.n_layers = static_cast<uint32_t>(c.n_layers);
  h.n_experts = static_cast<uint32_t>(c.n_experts);
  h.hidden = static_cast<uint32_t>(c.hidden_size);
  h.top_k = static_cast<uint32_t>(c.n_experts_per_tok);
  h.max_tokens = 8;
  h.n_microbatches = 1;
  h.tp_degree = 0;  // whatever the FFN worker has
  h.epoch = epoch;
  if (epoch > 0) {
    h.n_parts = n_parts;
    h.part_begin = begin;
    h.part_end = end;
    h.expert_begin = static_cast<uint32_t>(begin * c.n_experts / n_parts);
    h.expert_end = static_cast<uint32_t>(end * c.n_experts / n_parts);
    h.holds_shared = begin == 0 ? 1 : 0;
  }
  return h;
}

TEST(FfnFailover, AFrameOfAnotherEpochIsRefusedWithAnErrorFrame) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(1, 2);  // start-up shard 1/2: experts [4, 8)
  Transport* t = c.attention("attn0");
  ASSERT_TRUE(t->connect("ffn1-addr").is_ok());
  auto peer = wait_for_peer(*t, "ffn1", deadline_in_ms(5000));
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  RawAttention a{t, *peer};
  // Epoch 2: everything as one part, shared included.
  auto ack = a.hello(attention_hello(*w, 2, 1, 0, 1));
  ASSERT_TRUE(ack.ok()) << ack.status().to_string();
  EXPECT_EQ(ack->epoch, 2u);
  EXPECT_EQ(ack->expert_begin, 0u);
  EXPECT_EQ(ack->expert_end, 8u);
  EXPECT_EQ(ack->holds_shared, 1);
  const uint64_t a2f = frame_tag(TagFamily::a2f, 0), f2a = frame_tag(TagFamily::f2a, 0);
  // A frame built for epoch 1: an error frame naming both epochs, same step and layer.
  size_t len = a2f_frame(w->config, &a.out, 1, 5);
  a.in.assign(a.out.size() * 2, 0);
  auto got = a.exchange(len, a2f, f2a);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  auto hdr = decode_header(a.in8(), *got);
  ASSERT_TRUE(hdr.ok()) << hdr.status().to_string();
  EXPECT_EQ(hdr->kind, FrameKind::error);
  EXPECT_EQ(hdr->step, 5u);
  auto why = decode_reason(a.in8(), *got);
  ASSERT_TRUE(why.ok());
  EXPECT_NE(why->find("assignment epoch mismatch: the frame was built for epoch 1, this FFN worker holds epoch 2"),
            std::string::npos)
      << *why;
  EXPECT_EQ(c.ffn[1]->wk->stats().stale_frames.load(), 1);
  EXPECT_EQ(c.ffn[1]->wk->stats().bad_frames.load(), 0);
  // The worker keeps serving: a frame of epoch 2 gets its reply.
  len = a2f_frame(w->config, &a.out, 2, 6);
  got = a.exchange(len, a2f, f2a);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  auto v = decode_f2a(a.in8(), *got, static_cast<uint32_t>(w->config.hidden_size), 2);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->header.step, 6u);
  // A hello again on the same connection moves it to another epoch; epoch 0 is its shard.
  ack = a.hello(attention_hello(*w, 0, 0, 0, 0));
  ASSERT_TRUE(ack.ok()) << ack.status().to_string();
  EXPECT_EQ(ack->epoch, 0u);
  EXPECT_EQ(ack->expert_begin, 4u);
  EXPECT_EQ(ack->expert_end, 8u);
  EXPECT_EQ(ack->holds_shared, 0);
  EXPECT_EQ(c.ffn[1]->wk->stats().attention_serving.load(), 1);
}

// TP workers hold slices of their start-up shard only: an explicit assignment is refused
// naming why, a lost TP worker is waited for (no takeover, logged) and membership changes are
// not supported.
TEST(FfnFailover, TpWorkersKeepTheirShards) {
  auto w = tiny_model();
  Cluster c(w);
  c.start(0, 2, /*tp=*/2);
  c.start(1, 2, /*tp=*/2);
  {
    Transport* t = c.attention("raw");
    ASSERT_TRUE(t->connect("ffn0-addr").is_ok());
    auto peer = wait_for_peer(*t, "ffn0", deadline_in_ms(5000));
    ASSERT_TRUE(peer.ok());
    RawAttention a{t, *peer};
    auto ack = a.hello(attention_hello(*w, 1, 1, 0, 1));
    ASSERT_FALSE(ack.ok());
    EXPECT_NE(ack.status().message().find("expert re-homing needs whole experts (--ffn-tp 1)"), std::string::npos)
        << ack.status().to_string();
    t->close();
  }
  FfnClientOptions o = client_opts(2);
  o.takeover_ms = 100;
  auto cl = FfnClient::create(w, c.attention("attn0"), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  EXPECT_FALSE((*cl)->membership().whole_experts);
  EXPECT_EQ((*cl)->add_member(FfnMember{"ffn9-addr", ""}).code(), StatusCode::not_supported);
  c.kill(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ((*cl)->membership().epoch, 0u);
  EXPECT_EQ((*cl)->health().message(), "FFN worker 'ffn1' is not connected");
}

// An in-process xAyF bundle (afd serve --in-process, generate, bench): a failed FFN worker
// thread leaves the process running; after the takeover time the other FFN worker holds both
// parts and decoding goes on with the logits of an unfaulted run, bit for bit.
TEST(FfnFailover, InProcessBundleSurvivesAFailedFfnWorker) {
  const std::string dir = AFD_SOURCE_DIR "/tests/reference/data/qwen2moe_shared";
  auto run = [&](bool fail_one, std::vector<int32_t>* toks, std::vector<float>* all) {
    EngineOptions eo;
    eo.model_dir = dir;
    eo.precision = Precision::reference;
    eo.topology = *parse_topology("1A2F");
    eo.kv.capacity_tokens = 256;
    eo.kv.max_seqs = 4;
    eo.microbatches = 2;
    eo.n_threads = 1;
    eo.afd.ffn_probe_ms = 0;
    eo.afd.ffn_takeover_ms = 300;
    auto w = load_model(dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    auto e = make_engine(eo, *w);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    auto* dp = dynamic_cast<DataParallelEngine*>(e->get());
    ASSERT_NE(dp, nullptr);
    const int64_t V = (*e)->config().vocab_size;
    std::vector<std::vector<int32_t>> next = {{1, 5, 9, 13, 2}, {1, 7, 3}};
    std::vector<int64_t> seqs = {*(*e)->create_sequence(), *(*e)->create_sequence()};
    for (int step = 0; step < 8; ++step) {
      if (fail_one && step == 3) {
        ASSERT_TRUE(dp->bundle().fail_ffn_worker(1, "test").is_ok());
      }
      std::vector<BatchItem> items;
      for (size_t i = 0; i < seqs.size(); ++i) items.push_back(BatchItem{seqs[i], next[i], false});
      std::vector<float> logits;
      Status st;
      // The scheduler's retry: a pass that fails on the lost worker runs again once the
      // engine is healthy (here: once the survivor has taken over).
      const int64_t dl = deadline_in_ms(10000);
      while (!(st = (*e)->forward(items, &logits)).is_ok() && now_ns() < dl) {
        ASSERT_EQ(st.code(), StatusCode::unavailable) << st.to_string();
        while (!(*e)->health().is_ok() && now_ns() < dl) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      all->insert(all->end(), logits.begin(), logits.end());
      for (size_t i = 0; i < seqs.size(); ++i) {
        const float* row = logits.data() + static_cast<int64_t>(i) * V;
        const int32_t t = static_cast<int32_t>(std::max_element(row, row + V) - row);
        toks->push_back(t);
        next[i] = {t};
      }
    }
    if (fail_one) {
      FfnMembership m = dp->bundle().ffn_clients()[0]->membership();
      EXPECT_EQ(m.takeovers, 1);
      EXPECT_EQ(m.assigned, 1);
      EXPECT_EQ(m.members[0].expert_end, (*e)->config().n_experts);
    }
  };
  std::vector<int32_t> clean, faulted;
  std::vector<float> clean_logits, faulted_logits;
  run(false, &clean, &clean_logits);
  run(true, &faulted, &faulted_logits);
  EXPECT_EQ(clean, faulted);
  ASSERT_EQ(clean_logits.size(), faulted_logits.size());
  for (size_t i = 0; i < clean_logits.size(); ++i) ASSERT_EQ(clean_logits[i], faulted_logits[i]) << i;
}

}  // namespace
}  // namespace afd
