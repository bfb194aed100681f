// libFuzzer target for the attention<->FFN wire decoders (comm/protocol.h): whatever a peer
// sends, decoding is a Status, never a crash, an out-of-bounds read (the frame sits in a
// heap block of exactly its length, so ASan sees any read past it) or undefined behaviour.
// Beyond that, every decoder that accepts a frame must have checked what its callers rely on:
//   - decode_header: payload_bytes == len - 64, and the 64 header bytes are exactly what
//     encode_header writes for the decoded fields (no field is ignored or read loosely);
//   - decode_a2f: the limits below, ids in [0, n_experts), finite weights, finite positive
//     scales, and the layout inside the frame;
//   - decode_f2a: n_tokens * hidden * 2 payload bytes;
//   - decode_handshake: TP rank < degree, expert range inside the model, 1..16 micro-batches;
//   - decode_probe / decode_reason: header-only probes, reasons of at most 4096 bytes.
//
// Input: byte 0 picks the mode, the rest is the frame. Mode 0 (even): as received. Mode 1
// (odd): the payload checksum (when flagged) and the header checksum are recomputed first,
// so mutations of sizes, counts, ids and floats get past the checksums to the checks behind
// them (a peer that computes its checksums correctly over garbage).
//
// Seeds: `AFD_FUZZ_WRITE_SEEDS=DIR fuzz_frames` writes one valid frame of every kind to DIR
// and exits (the committed corpus in tests/fuzz/comm/corpus was made this way).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/protocol.h"

using namespace afd::comm;

namespace {

constexpr A2fLimits kLimits{/*hidden=*/256, /*top_k=*/2, /*n_experts=*/8, /*max_tokens=*/16};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "invariant broken: %s\n", what);
  std::abort();
}

// Writes a seed that its decoder accepts (so the fuzzer starts from frames that reach every check).
void write_seed(const std::string& dir, const char* name, const std::vector<uint8_t>& bytes) {
  std::unique_ptr<uint8_t[]> frame(new uint8_t[bytes.size()]);
  std::memcpy(frame.get(), bytes.data(), bytes.size());
  auto h = decode_header(frame.get(), bytes.size());
  if (!h.ok()) fail("a seed does not decode");
  bool ok = true;
  switch (h->kind) {
    case FrameKind::a2f: ok = decode_a2f(frame.get(), bytes.size(), kLimits).ok(); break;
    case FrameKind::f2a: ok = decode_f2a(frame.get(), bytes.size(), kLimits.hidden, h->n_tokens).ok(); break;
    case FrameKind::hello:
    case FrameKind::hello_ack: ok = decode_handshake(frame.get(), bytes.size(), h->kind).ok(); break;
    case FrameKind::refuse:
    case FrameKind::error: ok = decode_reason(frame.get(), bytes.size()).ok(); break;
    case FrameKind::ping:
    case FrameKind::pong: ok = decode_probe(frame.get(), bytes.size(), h->kind).ok(); break;
  }
  if (!ok) fail("a seed does not decode");
  for (uint8_t mode : {0, 1}) {
    std::string path = dir + "/" + (mode ? "sealed_" : "raw_") + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) fail("cannot write a seed file");
    std::fputc(mode, f);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

// Mode 1: recompute the checksums as an honest sender would (offsets: docs/PROTOCOL.md).
void seal(uint8_t* f, size_t len) {
  if (len < kFrameHeaderBytes) return;
  uint16_t flags;
  std::memcpy(&flags, f + 14, 2);
  if (flags & kFlagPayloadChecksum) {
    uint64_t ps = hash64(f + kFrameHeaderBytes, len - kFrameHeaderBytes);
    std::memcpy(f + 48, &ps, 8);
  }
  uint64_t hs = hash64(f, 56);
  std::memcpy(f + 56, &hs, 8);
}

std::vector<uint8_t> a2f_seed(uint32_t n, uint32_t top_k, ScaleGranularity g) {
  auto l = a2f_layout(n, kLimits.hidden, top_k, g);
  if (!l.ok()) fail("seed layout");
  std::vector<uint8_t> b(kFrameHeaderBytes + l->total, 0);
  uint8_t* p = b.data() + kFrameHeaderBytes;
  for (size_t i = 0; i < n * kLimits.hidden; ++i) p[l->q + i] = static_cast<uint8_t>(i * 7);
  for (int64_t i = 0; i < n * l->n_scales_per_token; ++i) {
    float s = 0.01f * static_cast<float>(i + 1);
    std::memcpy(p + l->scales + 4 * i, &s, 4);
  }
  for (uint32_t i = 0; i < n * top_k; ++i) {
    int32_t e = static_cast<int32_t>(i % kLimits.n_experts);
    float w = 0.5f;
    std::memcpy(p + l->ids + 4 * i, &e, 4);
    std::memcpy(p + l->weights + 4 * i, &w, 4);
  }
  FrameHeader h;
  h.kind = FrameKind::a2f;
  h.granularity = g;
  h.layer = 1;
  h.step = 42;
  h.n_tokens = n;
  h.hidden = kLimits.hidden;
  h.top_k = top_k;
  h.payload_bytes = l->total;
  h.flags = kFlagPayloadChecksum;
  encode_header(h, p, b.data());
  return b;
}

void write_seeds(const std::string& dir) {
  write_seed(dir, "a2f_per_token", a2f_seed(3, 2, ScaleGranularity::per_token));
  write_seed(dir, "a2f_per_block", a2f_seed(2, 2, ScaleGranularity::per_block));
  write_seed(dir, "a2f_dense", a2f_seed(1, 0, ScaleGranularity::per_token));
  {
    std::vector<uint8_t> b(kFrameHeaderBytes + f2a_payload_bytes(2, kLimits.hidden), 0x3f);
    FrameHeader h;
    h.kind = FrameKind::f2a;
    h.n_tokens = 2;
    h.hidden = kLimits.hidden;
    h.ffn_us = 120;
    h.payload_bytes = b.size() - kFrameHeaderBytes;
    encode_header(h, nullptr, b.data());
    write_seed(dir, "f2a", b);
  }
  Handshake hs;
  hs.fingerprint = 0x1234abcd;
  hs.n_attention = 2;
  hs.n_ffn = 2;
  hs.n_layers = 3;
  hs.n_experts = kLimits.n_experts;
  hs.hidden = kLimits.hidden;
  hs.top_k = kLimits.top_k;
  hs.max_tokens = kLimits.max_tokens;
  hs.n_microbatches = 3;
  std::vector<uint8_t> b(kFrameHeaderBytes + kMaxReasonBytes);
  b.resize(encode_handshake(FrameKind::hello, hs, b.data()));
  write_seed(dir, "hello", b);
  {  // An explicit assignment (epoch >= 1): parts [1, 3) of 4.
    Handshake e = hs;
    e.epoch = 2;
    e.n_parts = 4;
    e.part_begin = 1;
    e.part_end = 3;
    e.expert_begin = static_cast<uint32_t>(1 * e.n_experts / 4);
    e.expert_end = static_cast<uint32_t>(3 * e.n_experts / 4);
    b.resize(kFrameHeaderBytes + kMaxReasonBytes);
    b.resize(encode_handshake(FrameKind::hello, e, b.data()));
    write_seed(dir, "hello_epoch", b);
  }
  hs.role = Role::ffn;
  hs.expert_begin = 4;
  hs.expert_end = 8;
  hs.tp_rank = 1;
  hs.tp_degree = 2;
  b.resize(kFrameHeaderBytes + kMaxReasonBytes);
  b.resize(encode_handshake(FrameKind::hello_ack, hs, b.data()));
  write_seed(dir, "hello_ack", b);
  b.resize(kFrameHeaderBytes + kMaxReasonBytes);
  b.resize(encode_reason(FrameKind::error, 2, 1, 9, "malformed a2f frame: checksum", b.data()));
  write_seed(dir, "error", b);
  b.resize(kFrameHeaderBytes + kMaxReasonBytes);
  b.resize(encode_reason(FrameKind::refuse, 0, 0, 0, "handshake mismatch: topologies differ", b.data()));
  write_seed(dir, "refuse", b);
  b.resize(kFrameHeaderBytes);
  encode_probe(FrameKind::ping, 7, b.data());
  write_seed(dir, "ping", b);
  encode_probe(FrameKind::pong, 7, b.data());
  write_seed(dir, "pong", b);
}

void check_header(const uint8_t* data, size_t len) {
  auto h = decode_header(data, len);
  if (!h.ok()) return;
  if (len < kFrameHeaderBytes || h->payload_bytes != len - kFrameHeaderBytes) fail("header accepted a wrong length");
  uint8_t again[kFrameHeaderBytes];
  encode_header(*h, data + kFrameHeaderBytes, again);
  if (std::memcmp(again, data, kFrameHeaderBytes) != 0) fail("an accepted header is not its fields' encoding");
}

void check_a2f(const uint8_t* data, size_t len) {
  auto v = decode_a2f(data, len, kLimits);
  if (!v.ok()) return;
  const FrameHeader& h = v->header;
  if (h.hidden != kLimits.hidden || h.n_tokens > kLimits.max_tokens) fail("a2f outside its limits");
  if (h.top_k != kLimits.top_k && h.top_k != 0) fail("a2f with another top_k");
  auto l = a2f_layout(h.n_tokens, h.hidden, h.top_k, h.granularity);
  if (!l.ok() || kFrameHeaderBytes + l->total != len) fail("a2f layout does not fill the frame");
  const uint8_t* end = data + len;
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < size_t{h.n_tokens} * h.hidden; ++i) sink = sink + v->q[i];  // ASan checks the bound
  for (size_t i = 0; i < size_t{h.n_tokens} * static_cast<size_t>(l->n_scales_per_token); ++i) {
    if (!(std::isfinite(v->scales[i]) && v->scales[i] > 0.0f)) fail("a2f scale not finite and positive");
  }
  for (size_t i = 0; i < size_t{h.n_tokens} * h.top_k; ++i) {
    if (v->ids[i] < 0 || static_cast<uint32_t>(v->ids[i]) >= kLimits.n_experts) fail("a2f expert id out of range");
    if (!std::isfinite(v->weights[i])) fail("a2f weight not finite");
  }
  if (reinterpret_cast<const uint8_t*>(v->weights + size_t{h.n_tokens} * h.top_k) > end) fail("a2f weights past the end");
  if (v->group * l->n_scales_per_token != h.hidden) fail("a2f scale group does not tile hidden");
}

void check_f2a(const uint8_t* data, size_t len) {
  auto h = decode_header(data, len);
  const uint32_t n = h.ok() ? h->n_tokens : 1;
  auto v = decode_f2a(data, len, kLimits.hidden, n);
  if (!v.ok()) return;
  if (kFrameHeaderBytes + f2a_payload_bytes(n, kLimits.hidden) != len) fail("f2a size does not match its tokens");
  volatile uint16_t sink = 0;
  for (size_t i = 0; i < size_t{n} * kLimits.hidden; ++i) sink = sink ^ v->out[i];
}

void check_handshake(const uint8_t* data, size_t len) {
  for (FrameKind k : {FrameKind::hello, FrameKind::hello_ack}) {
    auto s = decode_handshake(data, len, k);
    if (!s.ok()) continue;
    if (s->tp_rank >= s->tp_degree && s->role == Role::ffn) fail("handshake TP rank not below its degree");
    if (s->expert_begin > s->expert_end || s->expert_end > s->n_experts) fail("handshake expert range outside the model");
    if (s->role == Role::attention && (s->n_microbatches < 1 || s->n_microbatches > 16)) fail("handshake micro-batches");
    if (s->epoch > 0) {
      const uint64_t P = s->n_parts;
      if (P < 1 || P > 64 || s->part_begin >= s->part_end || s->part_end > P) fail("handshake parts not a range of 1..64");
      if (s->expert_begin != s->part_begin * uint64_t{s->n_experts} / P ||
          s->expert_end != s->part_end * uint64_t{s->n_experts} / P || (s->holds_shared != 0) != (s->part_begin == 0))
        fail("handshake parts and experts disagree");
    } else if (s->n_parts != 0 || s->part_begin != 0 || s->part_end != 0) {
      fail("handshake of epoch 0 with parts");
    }
    (void)describe(*s);
  }
}

void check_small(const uint8_t* data, size_t len) {
  for (FrameKind k : {FrameKind::ping, FrameKind::pong}) {
    if (decode_probe(data, len, k).ok() && len != kFrameHeaderBytes) fail("a probe with a payload");
  }
  auto r = decode_reason(data, len);
  if (r.ok()) {
    if (r->size() > kMaxReasonBytes) fail("reason longer than 4096 bytes");
    for (char c : *r) {
      if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') fail("reason with a control character");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("AFD_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool sealed = data[0] & 1;
  ++data, --size;
  // A heap block of exactly `size` bytes (new[] is at least 8-byte aligned, as decoders require).
  std::unique_ptr<uint8_t[]> frame(new uint8_t[size == 0 ? 1 : size]);
  if (size != 0) std::memcpy(frame.get(), data, size);
  if (sealed) seal(frame.get(), size);
  check_header(frame.get(), size);
  check_a2f(frame.get(), size);
  check_f2a(frame.get(), size);
  check_handshake(frame.get(), size);
  check_small(frame.get(), size);
  return 0;
}
