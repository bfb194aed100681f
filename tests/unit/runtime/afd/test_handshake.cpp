// runtime/afd/handshake.h: the fields both sides fill from the model, each side's check of
// the other's frame, and the attention side's hello exchange over an in-process transport.
#include <gtest/gtest.h>

#include <thread>

#include "../../comm/transport_pair.h"
#include "comm/protocol.h"
#include "model/tools/make_model.h"
#include "runtime/afd/handshake.h"

namespace afd::test_handshake {
namespace {

using comm::Handshake;
using comm::Role;
using comm::WirePrecision;

ModelConfig tiny_config() {
  auto c = make_preset_config(Arch::qwen2_moe, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

// An FFN worker's and an attention worker's handshakes for one model that fit each other.
struct Sides {
  Handshake ffn, attn;
  explicit Sides(const ModelConfig& c) {
    ffn = model_handshake(c, 0x1234, Role::ffn, WirePrecision::f32);
    attn = model_handshake(c, 0x1234, Role::attention, WirePrecision::f32);
    ffn.n_attention = attn.n_attention = 1;
    ffn.n_ffn = attn.n_ffn = 1;
    attn.max_tokens = 64;
    attn.n_microbatches = 2;
  }
};

TEST(AfdHandshake, ModelFields) {
  const ModelConfig c = tiny_config();
  const Handshake h = model_handshake(c, 0xabcdef, Role::ffn, WirePrecision::bf16);
  EXPECT_EQ(h.fingerprint, 0xabcdefu);
  EXPECT_EQ(h.role, Role::ffn);
  EXPECT_EQ(h.n_layers, static_cast<uint32_t>(c.n_layers));
  EXPECT_EQ(h.n_experts, static_cast<uint32_t>(c.n_experts));
  EXPECT_EQ(h.hidden, static_cast<uint32_t>(c.hidden_size));
  EXPECT_EQ(h.top_k, static_cast<uint32_t>(c.n_experts_per_tok));
  EXPECT_EQ(h.precision, WirePrecision::bf16);
  EXPECT_EQ(wire_precision(kernels::ActPrecision::f32), WirePrecision::f32);
  EXPECT_EQ(wire_precision(kernels::ActPrecision::bf16), WirePrecision::bf16);
}

TEST(AfdHandshake, FfnSideChecksHello) {
  const ModelConfig c = tiny_config();
  Sides s(c);
  EXPECT_TRUE(check_hello(s.ffn, s.attn).is_ok());
  auto refused = [&](Handshake h, const std::string& what) {
    Status st = check_hello(s.ffn, h);
    EXPECT_EQ(st.code(), StatusCode::invalid_argument) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  Handshake h = s.attn;
  h.fingerprint ^= 1;
  refused(h, "fingerprint");
  h = s.attn;
  h.precision = WirePrecision::bf16;
  refused(h, "precision");
  h = s.attn;
  h.max_tokens = 0;
  refused(h, "max_tokens");
  h.max_tokens = (1u << 20) + 1;
  refused(h, "max_tokens");
  // An FFN worker saying hello to an FFN worker: the common check names it.
  refused(s.ffn, "same role");
  // Per-128 scales need hidden % 128 == 0.
  h = s.attn;
  h.granularity = comm::ScaleGranularity::per_block;
  Handshake ffn = s.ffn;
  ffn.hidden = h.hidden = 200;
  EXPECT_NE(check_hello(ffn, h).message().find("per-128"), std::string::npos);
  ffn.hidden = h.hidden = 256;
  EXPECT_TRUE(check_hello(ffn, h).is_ok());
}

TEST(AfdHandshake, AttentionSideChecksAck) {
  const ModelConfig c = tiny_config();
  Sides s(c);
  EXPECT_TRUE(check_ack(s.attn, s.ffn).is_ok());
  Handshake h = s.ffn;
  h.n_layers += 1;
  EXPECT_NE(check_ack(s.attn, h).message().find("shapes"), std::string::npos);
  h = s.ffn;
  h.role = Role::attention;
  EXPECT_EQ(check_ack(s.attn, h).code(), StatusCode::invalid_argument);
}

// The hello reaches the peer on the handshake tag; its answer comes back in `in`. A peer
// that does not answer: the reply's status is the timeout.
TEST(AfdHandshake, ExchangeHello) {
  const ModelConfig c = tiny_config();
  Sides s(c);
  comm::testing::Pair p = comm::testing::make_pair("inproc");
  ASSERT_NE(p.a_sees_b, comm::kNoPeer);
  std::thread ffn([&] {
    auto in = comm::FrameBuffer::create(p.a.get(), comm::kFrameHeaderBytes + comm::kMaxReasonBytes);
    auto out = comm::FrameBuffer::create(p.a.get(), comm::kFrameHeaderBytes + comm::kHandshakeBytes);
    ASSERT_TRUE(in.ok() && out.ok());
    auto r = p.a->post_recv(p.a_sees_b, handshake_tag(), in->data(), in->capacity());
    ASSERT_TRUE(r.ok());
    comm::Completion got = p.a->wait(*r, now_ns() + int64_t{10000} * 1000000);
    ASSERT_TRUE(got.status.is_ok()) << got.status.to_string();
    auto hello = comm::decode_handshake(in->data(), got.bytes, comm::FrameKind::hello);
    ASSERT_TRUE(hello.ok()) << hello.status().to_string();
    EXPECT_TRUE(check_hello(s.ffn, *hello).is_ok());
    const size_t n = comm::encode_handshake(comm::FrameKind::hello_ack, s.ffn, out->data());
    auto sd = p.a->post_send(p.a_sees_b, handshake_tag(), out->data(), n);
    ASSERT_TRUE(sd.ok());
    p.a->wait(*sd, now_ns() + int64_t{10000} * 1000000);
  });
  auto x = exchange_hello(p.b.get(), p.b_sees_a, s.attn, 10000);
  ffn.join();
  ASSERT_TRUE(x.ok()) << x.status().to_string();
  ASSERT_TRUE(x->sent.is_ok());
  ASSERT_TRUE(x->reply.status.is_ok()) << x->reply.status.to_string();
  auto ack = comm::decode_handshake(x->in.data(), x->reply.bytes, comm::FrameKind::hello_ack);
  ASSERT_TRUE(ack.ok()) << ack.status().to_string();
  EXPECT_TRUE(check_ack(s.attn, *ack).is_ok());

  // Nobody answers now: the receive times out (and is cancelled).
  auto silent = exchange_hello(p.b.get(), p.b_sees_a, s.attn, 50);
  ASSERT_TRUE(silent.ok());
  EXPECT_TRUE(silent->sent.is_ok());
  EXPECT_EQ(silent->reply.status.code(), StatusCode::timeout);
}

}  // namespace
}  // namespace afd::test_handshake
