// The attention<->FFN wire format (docs/PROTOCOL.md is the normative description).
//
// Every message is one frame: a 64-byte header followed by a payload whose layout the
// header fully determines. All integers little-endian. Frames are built in place in the
// sender's registered buffer (encode_*) and decoded as views into the receiver's buffer
// (decode_*): no copies, and nothing from the peer is trusted — every count, size, id and
// float is validated; a malformed frame is a corrupt_data Status, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/hash.h"
#include "core/status.h"

namespace afd::comm {

constexpr uint32_t kFrameMagic = 0x46444641u;  // "AFDF" in memory order
// 2: handshake carries the FFN TP rank/degree; 3: ping/pong probes; 4: expert assignment epoch
// (hello carries the assignment, a2f frames the epoch they were built for); 5: the handshake
// carries the activation precision (refused when the sides differ); 6: the batch-invariant
// flag; 7: expert placement (the handshake's `placement` flag; a2f ids of -1 in its frames).
constexpr uint16_t kProtocolVersion = 7;
constexpr size_t kFrameHeaderBytes = 64;
constexpr size_t kMaxReasonBytes = 4096;
constexpr int64_t kScaleBlock = 128;  // channels per scale with ScaleGranularity::per_block

enum class FrameKind : uint8_t {
  hello = 1,      // attention -> FFN: fingerprint + topology, first frame on a connection
  hello_ack = 2,  // FFN -> attention: accepted; carries the FFN worker's topology
  refuse = 3,     // either way: the handshake failed; payload = UTF-8 reason
  a2f = 4,        // attention -> FFN: FP8 activations + scales + expert ids + weights
  f2a = 5,        // FFN -> attention: BF16 partial outputs
  error = 6,      // FFN -> attention: this (layer, micro-batch) failed; payload = reason
  ping = 7,       // attention -> FFN: liveness probe; no payload, step = probe sequence number
  pong = 8,       // FFN -> attention: answers a ping; echoes its sequence number in step
};
const char* frame_kind_name(FrameKind k);

enum class ScaleGranularity : uint8_t { none = 0, per_token = 1, per_block = 2 };

// Header flags.
constexpr uint16_t kFlagPayloadChecksum = 1;  // payload_checksum covers the payload

struct FrameHeader {
  FrameKind kind = FrameKind::a2f;
  ScaleGranularity granularity = ScaleGranularity::none;
  uint16_t flags = 0;
  uint32_t layer = 0;
  uint16_t microbatch = 0;
  uint64_t step = 0;
  uint32_t n_tokens = 0;
  uint32_t hidden = 0;
  uint32_t top_k = 0;
  // f2a: the FFN worker's compute time for this (layer, micro-batch) batch in microseconds
  // (saturating; informational, for per-layer stage times); 0 in every other kind.
  uint32_t ffn_us = 0;
  // a2f: the expert assignment epoch the frame was built for (the epoch of the sender's last
  // handshake with this FFN worker); the FFN worker answers a frame of another epoch with an
  // error frame. Shares header bytes 36..39 with ffn_us (each kind uses one); 0 elsewhere.
  uint32_t epoch = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
};

// Byte offsets inside an a2f payload (relative to the payload start), all 8-byte aligned.
//   q       [n, hidden]        fp8 e4m3
//   scales  [n, hidden/group]  f32   (group = hidden per token, 128 per block)
//   ids     [n, top_k]         i32
//   weights [n, top_k]         f32
struct A2fLayout {
  size_t q = 0, scales = 0, ids = 0, weights = 0, total = 0;
  int64_t n_scales_per_token = 0;
};
// Layout for n tokens; invalid_argument if hidden is not compatible with the granularity
// (per_block needs hidden % 128 == 0; hidden % 8 == 0 always).
Result<A2fLayout> a2f_layout(int64_t n, int64_t hidden, int64_t top_k, ScaleGranularity g);
// f2a payload: out [n, hidden] bf16.
inline size_t f2a_payload_bytes(int64_t n, int64_t hidden) { return static_cast<size_t>(n * hidden) * 2; }

// Topology + model identity exchanged by hello / hello_ack.
enum class Role : uint8_t { attention = 0, ffn = 1 };
// The activation precision a side computes with (`--precision`): the FFN worker's rounding of
// its inputs and intermediates, the attention worker's own. Both sides of a connection must
// compute with the same one, else the bundle's answers differ from a uniform one's.
enum class WirePrecision : uint8_t {
  f32 = 1,   // --precision reference: f32 activations
  bf16 = 2,  // --precision fast: bf16 activations into the matrix products
};
// "reference (f32 activations)" | "fast (bf16 activations)"
const char* wire_precision_name(WirePrecision p);
struct Handshake {
  uint64_t fingerprint = 0;      // model_fingerprint() of the sender's model
  Role role = Role::attention;
  uint16_t index = 0;            // this worker's index within its role
  uint16_t n_attention = 0;      // x of xAyF
  uint16_t n_ffn = 0;            // y of xAyF
  uint32_t expert_begin = 0;     // FFN: experts [begin, end) held; attention: 0, 0
  uint32_t expert_end = 0;
  uint8_t holds_shared = 0;      // FFN: computes the shared expert and dense layers
  // FFN: which intermediate slice of its experts (and shared/dense part) it holds: rows
  // [tp_rank*I/tp_degree, (tp_rank+1)*I/tp_degree); 0 of 1 = whole experts. Attention:
  // the TP degree it expects of every FFN worker, 0 = whatever they announce.
  uint16_t tp_rank = 0;
  uint16_t tp_degree = 1;
  uint32_t n_layers = 0;
  uint32_t n_experts = 0;
  uint32_t hidden = 0;
  uint32_t top_k = 0;
  uint32_t max_tokens = 0;       // attention: most tokens in one a2f frame
  uint16_t n_microbatches = 0;   // attention: micro-batches it uses (1..4)
  ScaleGranularity granularity = ScaleGranularity::per_token;
  WirePrecision precision = WirePrecision::f32;  // the sender's activation precision (compared)
  // The sender runs batch-invariant (--deterministic): its matrix products take the canonical
  // order at every token count (compared: both sides must agree, else the bundle's answers
  // would depend on the batch after all).
  uint8_t batch_invariant = 0;
  // Expert assignment epoch. Attention hello: 0 = "hold the experts you were started with"
  // (the expert and part fields are 0 and ignored); >= 1 = "for me, hold parts
  // [part_begin, part_end) of n_parts", part q being routed experts [q*E/n_parts,
  // (q+1)*E/n_parts) plus, for q = 0, the shared expert and dense layers; expert_begin/end
  // and holds_shared then say the same in experts (checked). Whole experts: an FFN worker
  // with TP degree > 1 refuses any assignment but epoch 0. FFN hello_ack: the epoch it
  // accepted, with what it now holds for that attention worker (n_parts 0 at epoch 0).
  // A part is the unit of BF16 rounding: an FFN worker replies one partial per part it holds
  // (docs/PROTOCOL.md, "f2a").
  uint32_t epoch = 0;
  uint16_t n_parts = 0;
  uint16_t part_begin = 0, part_end = 0;
  // Expert placement (epoch >= 1, n_parts 0, experts [0, n_experts)): "compute the (token,
  // expert) pairs each a2f frame names, whichever experts they are, and reply one BF16 row per
  // pair — the routing weight times the expert's output — in expert order, then, with
  // holds_shared, one row per token of the shared expert / dense layer". A pair of the frame
  // that another FFN worker computes has id -1. Every pair is then its own partial, so the sum
  // does not depend on which worker computed what (docs/PROTOCOL.md, "Expert placement").
  uint8_t placement = 0;
};
constexpr size_t kHandshakeBytes = 64;
std::string describe(const Handshake& h);

// Header and optional payload checksums: core/hash.h.
using afd::hash64;

// Writes the header (with its checksum) to out[0, 64). When kFlagPayloadChecksum is set
// in h.flags, `payload` (h.payload_bytes bytes) is hashed into it first.
void encode_header(FrameHeader h, const uint8_t* payload, uint8_t* out);

// Decodes and validates a header: magic, version, known kind/granularity, header
// checksum, payload_bytes == len - 64, the payload size the kind implies, and (when
// flagged) the payload checksum. `len` is the received message length.
Result<FrameHeader> decode_header(const uint8_t* data, size_t len);

// Limits a receiver enforces on a2f frames (from its model and the peer's handshake).
struct A2fLimits {
  uint32_t hidden = 0;       // must equal
  uint32_t top_k = 0;        // must equal
  uint32_t n_experts = 0;    // ids must be < n_experts
  uint32_t max_tokens = 0;   // n_tokens <= max_tokens
  bool unrouted_ids = false;  // ids may also be -1 (expert placement: a pair for another worker)
};
struct A2fView {
  FrameHeader header;
  const uint8_t* q = nullptr;        // [n, hidden]
  const float* scales = nullptr;     // [n, n_scales_per_token]
  const int32_t* ids = nullptr;      // [n, top_k]
  const float* weights = nullptr;    // [n, top_k]
  int64_t group = 0;                 // channels per scale
};
// `data` must be 8-byte aligned. Validates the header, limits, ids in [0, n_experts) (or -1
// with unrouted_ids),
// finite routing weights and finite positive scales.
Result<A2fView> decode_a2f(const uint8_t* data, size_t len, const A2fLimits& lim);

struct F2aView {
  FrameHeader header;
  const uint16_t* out = nullptr;  // [n, hidden] bf16
};
// Checks the kind, hidden and n_tokens == expect_tokens.
Result<F2aView> decode_f2a(const uint8_t* data, size_t len, uint32_t hidden, uint32_t expect_tokens);

// hello / hello_ack frames (kHeaderBytes + kHandshakeBytes).
size_t encode_handshake(FrameKind kind, const Handshake& h, uint8_t* out);
Result<Handshake> decode_handshake(const uint8_t* data, size_t len, FrameKind expect);
// refuse / error frames carrying a reason (truncated to kMaxReasonBytes). Returns bytes written.
size_t encode_reason(FrameKind kind, uint32_t layer, uint16_t microbatch, uint64_t step,
                     const std::string& reason, uint8_t* out);
// The reason text of a refuse/error frame (validated header).
Result<std::string> decode_reason(const uint8_t* data, size_t len);

// ping / pong frames (kFrameHeaderBytes, no payload) carrying `seq` in the step field.
size_t encode_probe(FrameKind kind, uint64_t seq, uint8_t* out);
// The sequence number of a ping or pong (whichever `expect` says; any other kind is corrupt).
Result<uint64_t> decode_probe(const uint8_t* data, size_t len, FrameKind expect);

// Transport user tags of the runtime (docs/PROTOCOL.md, "Tags"): family in bits 47..40,
// micro-batch in 39..32. The layer and step travel in the frame header.
enum class TagFamily : uint8_t { handshake = 1, a2f = 2, f2a = 3, probe = 4 };
inline uint64_t frame_tag(TagFamily f, uint32_t microbatch) {
  return (static_cast<uint64_t>(f) << 40) | (static_cast<uint64_t>(microbatch & 0xffu) << 32);
}

// Checks that an FFN worker's handshake fits the attention side's (same fingerprint, same
// x, hidden/top_k/n_experts/n_layers agree, same activation precision; y is not compared: the FFN membership may change
// while the deployment runs, the assignment travels in the hello). Error message names the
// mismatch.
Status check_handshake_match(const Handshake& mine, const Handshake& theirs);

}  // namespace afd::comm
