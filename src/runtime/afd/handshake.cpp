#include "runtime/afd/handshake.h"

#include <string>

#include "runtime/afd/transport_ops.h"

namespace afd {

using namespace comm;

uint64_t handshake_tag() { return frame_tag(TagFamily::handshake, 0); }

WirePrecision wire_precision(kernels::ActPrecision p) {
  return p == kernels::ActPrecision::f32 ? WirePrecision::f32 : WirePrecision::bf16;
}

Handshake model_handshake(const ModelConfig& c, uint64_t fingerprint, Role role, WirePrecision prec) {
  Handshake h;
  h.fingerprint = fingerprint;
  h.role = role;
  h.n_layers = static_cast<uint32_t>(c.n_layers);
  h.n_experts = static_cast<uint32_t>(c.n_experts);
  h.hidden = static_cast<uint32_t>(c.hidden_size);
  h.top_k = static_cast<uint32_t>(c.n_experts_per_tok);
  h.precision = prec;
  return h;
}

Status check_hello(const Handshake& mine, const Handshake& hello) {
  AFD_RETURN_IF_ERROR(check_handshake_match(mine, hello));
  if (hello.role != Role::attention) return invalid_argument("peer is not an attention worker");
  if (hello.max_tokens < 1 || hello.max_tokens > (1u << 20)) {
    return invalid_argument("max_tokens " + std::to_string(hello.max_tokens) + " outside 1..2^20");
  }
  if (hello.granularity == ScaleGranularity::per_block && mine.hidden % kScaleBlock != 0) {
    return invalid_argument("per-128 scales need hidden % 128 == 0");
  }
  return Status();
}

Status check_ack(const Handshake& mine, const Handshake& ack) {
  AFD_RETURN_IF_ERROR(check_handshake_match(mine, ack));
  if (ack.role != Role::ffn) return invalid_argument("peer is not an FFN worker: " + describe(ack));
  return Status();
}

Result<HelloExchange> exchange_hello(Transport* t, PeerId peer, const Handshake& mine, int64_t timeout_ms) {
  AFD_ASSIGN_OR_RETURN(FrameBuffer out, FrameBuffer::create(t, kFrameHeaderBytes + kHandshakeBytes));
  HelloExchange x;
  AFD_ASSIGN_OR_RETURN(x.in, FrameBuffer::create(t, kFrameHeaderBytes + kMaxReasonBytes));
  const size_t len = encode_handshake(FrameKind::hello, mine, out.data());
  AFD_ASSIGN_OR_RETURN(RequestId r, t->post_recv(peer, handshake_tag(), x.in.data(), x.in.capacity()));
  auto s = t->post_send(peer, handshake_tag(), out.data(), len);
  if (!s.ok()) {
    cancel_and_wait(t, r, 5000);
    x.sent = s.status();
    return x;
  }
  x.reply = wait_or_cancel(t, r, timeout_ms, 5000);
  wait_or_cancel(t, *s, 5000, 5000);
  return x;
}

}  // namespace afd
