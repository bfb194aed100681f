// The AFD handshake (docs/PROTOCOL.md, "Handshake"), the parts the attention side
// (FfnClient) and the FFN side (FfnWorker) share: the fields both fill from the model, the
// checks each side makes of the other's frame, and the attention side's hello exchange.
// The per-side decisions (which expert assignment to ask for or grant, duplicate attention
// indices, buffers) stay with the client and the worker.
#pragma once

#include <cstdint>

#include "comm/frame_buffer.h"
#include "comm/protocol.h"
#include "comm/transport.h"
#include "core/status.h"
#include "kernels/cpu/ops.h"
#include "model/config.h"

namespace afd {

// The tag of hello / hello_ack / refuse frames.
uint64_t handshake_tag();

// The wire name of an engine's activation precision (--precision).
comm::WirePrecision wire_precision(kernels::ActPrecision p);

// A handshake with the fields the model and the precision give: fingerprint (the whole
// model's: model/fingerprint.h), role, n_layers, n_experts, hidden, top_k, precision. The
// caller adds topology, buffers and assignment.
comm::Handshake model_handshake(const ModelConfig& c, uint64_t fingerprint, comm::Role role, comm::WirePrecision prec);

// FFN side: whether an attention worker's hello fits this FFN worker (`mine`): the common
// match (comm::check_handshake_match), the role, max_tokens in 1..2^20, and per-128 scales
// only when hidden % 128 == 0. invalid_argument naming the mismatch otherwise.
Status check_hello(const comm::Handshake& mine, const comm::Handshake& hello);

// Attention side: whether an FFN worker's hello_ack fits this attention worker: the common
// match and the role. invalid_argument naming the mismatch otherwise.
Status check_ack(const comm::Handshake& mine, const comm::Handshake& ack);

// Attention side: one hello on fresh buffers. `sent` is the error of posting the hello (then
// nothing was received); otherwise `reply` is the answer's receive (waited up to
// timeout_ms; cancelled past it) and `in` holds its bytes.
struct HelloExchange {
  Status sent;
  comm::Completion reply;
  comm::FrameBuffer in;
};
Result<HelloExchange> exchange_hello(comm::Transport* t, comm::PeerId peer, const comm::Handshake& mine,
                                     int64_t timeout_ms);

}  // namespace afd
