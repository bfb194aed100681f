#include "comm/protocol.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace afd::comm {

static_assert(std::endian::native == std::endian::little, "afd wire format assumes a little-endian host");

namespace {

// Header byte offsets (docs/PROTOCOL.md, "Frame header").
enum : size_t {
  kOffMagic = 0, kOffVersion = 4, kOffKind = 6, kOffGran = 7, kOffLayer = 8, kOffMb = 12,
  kOffFlags = 14, kOffStep = 16, kOffTokens = 24, kOffHidden = 28, kOffTopK = 32,
  kOffFfnUs = 36, kOffEpoch = 36, kOffPayloadBytes = 40, kOffPayloadSum = 48, kOffHeaderSum = 56,
};

template <class T>
void put(uint8_t* p, size_t off, T v) { std::memcpy(p + off, &v, sizeof(T)); }
template <class T>
T get(const uint8_t* p, size_t off) { T v; std::memcpy(&v, p + off, sizeof(T)); return v; }

size_t align8(size_t x) { return (x + 7) & ~size_t{7}; }

bool known_kind(uint8_t k) { return k >= 1 && k <= 8; }

std::string where(const FrameHeader& h) {
  return std::string(frame_kind_name(h.kind)) + " frame (layer " + std::to_string(h.layer) +
         ", micro-batch " + std::to_string(h.microbatch) + ", step " + std::to_string(h.step) + ")";
}

}  // namespace

const char* frame_kind_name(FrameKind k) {
  switch (k) {
    case FrameKind::hello: return "hello";
    case FrameKind::hello_ack: return "hello_ack";
    case FrameKind::refuse: return "refuse";
    case FrameKind::a2f: return "a2f";
    case FrameKind::f2a: return "f2a";
    case FrameKind::error: return "error";
    case FrameKind::ping: return "ping";
    case FrameKind::pong: return "pong";
  }
  return "unknown";
}

Result<A2fLayout> a2f_layout(int64_t n, int64_t hidden, int64_t top_k, ScaleGranularity g) {
  if (n < 0 || hidden <= 0 || top_k < 0) return invalid_argument("a2f layout: negative size");
  if (hidden % 8 != 0) return invalid_argument("a2f layout: hidden " + std::to_string(hidden) + " is not a multiple of 8");
  A2fLayout l;
  if (g == ScaleGranularity::per_token) {
    l.n_scales_per_token = 1;
  } else if (g == ScaleGranularity::per_block) {
    if (hidden % kScaleBlock != 0) {
      return invalid_argument("a2f layout: per-128 scales need hidden % 128 == 0, hidden is " + std::to_string(hidden));
    }
    l.n_scales_per_token = hidden / kScaleBlock;
  } else {
    return invalid_argument("a2f layout: scale granularity must be per_token or per_block");
  }
  size_t un = static_cast<size_t>(n);
  l.q = 0;
  l.scales = align8(un * static_cast<size_t>(hidden));
  l.ids = align8(l.scales + un * static_cast<size_t>(l.n_scales_per_token) * 4);
  l.weights = align8(l.ids + un * static_cast<size_t>(top_k) * 4);
  l.total = align8(l.weights + un * static_cast<size_t>(top_k) * 4);
  return l;
}

void encode_header(FrameHeader h, const uint8_t* payload, uint8_t* out) {
  std::memset(out, 0, kFrameHeaderBytes);
  if ((h.flags & kFlagPayloadChecksum) && payload != nullptr) {
    h.payload_checksum = hash64(payload, h.payload_bytes);
  } else {
    h.flags &= static_cast<uint16_t>(~kFlagPayloadChecksum);
    h.payload_checksum = 0;
  }
  put<uint32_t>(out, kOffMagic, kFrameMagic);
  put<uint16_t>(out, kOffVersion, kProtocolVersion);
  put<uint8_t>(out, kOffKind, static_cast<uint8_t>(h.kind));
  put<uint8_t>(out, kOffGran, static_cast<uint8_t>(h.granularity));
  put<uint32_t>(out, kOffLayer, h.layer);
  put<uint16_t>(out, kOffMb, h.microbatch);
  put<uint16_t>(out, kOffFlags, h.flags);
  put<uint64_t>(out, kOffStep, h.step);
  put<uint32_t>(out, kOffTokens, h.n_tokens);
  put<uint32_t>(out, kOffHidden, h.hidden);
  put<uint32_t>(out, kOffTopK, h.top_k);
  // Bytes 36..39: the f2a frame's compute time, the a2f frame's assignment epoch.
  if (h.kind == FrameKind::f2a) put<uint32_t>(out, kOffFfnUs, h.ffn_us);
  if (h.kind == FrameKind::a2f) put<uint32_t>(out, kOffEpoch, h.epoch);
  put<uint64_t>(out, kOffPayloadBytes, h.payload_bytes);
  put<uint64_t>(out, kOffPayloadSum, h.payload_checksum);
  put<uint64_t>(out, kOffHeaderSum, hash64(out, kOffHeaderSum));
}

Result<FrameHeader> decode_header(const uint8_t* data, size_t len) {
  if (data == nullptr || len < kFrameHeaderBytes) {
    return corrupt_data("frame of " + std::to_string(len) + " bytes is shorter than the 64-byte header");
  }
  uint32_t magic = get<uint32_t>(data, kOffMagic);
  if (magic != kFrameMagic) return corrupt_data("frame has bad magic (not an afd frame)");
  uint16_t version = get<uint16_t>(data, kOffVersion);
  if (version != kProtocolVersion) {
    return corrupt_data("frame has protocol version " + std::to_string(version) + ", this build speaks " +
                        std::to_string(kProtocolVersion));
  }
  if (get<uint64_t>(data, kOffHeaderSum) != hash64(data, kOffHeaderSum)) {
    return corrupt_data("frame header checksum mismatch");
  }
  FrameHeader h;
  uint8_t kind = get<uint8_t>(data, kOffKind);
  if (!known_kind(kind)) return corrupt_data("frame has unknown kind " + std::to_string(kind));
  h.kind = static_cast<FrameKind>(kind);
  uint8_t gran = get<uint8_t>(data, kOffGran);
  if (gran > 2) return corrupt_data("frame has unknown scale granularity " + std::to_string(gran));
  h.granularity = static_cast<ScaleGranularity>(gran);
  h.layer = get<uint32_t>(data, kOffLayer);
  h.microbatch = get<uint16_t>(data, kOffMb);
  h.flags = get<uint16_t>(data, kOffFlags);
  h.step = get<uint64_t>(data, kOffStep);
  h.n_tokens = get<uint32_t>(data, kOffTokens);
  h.hidden = get<uint32_t>(data, kOffHidden);
  h.top_k = get<uint32_t>(data, kOffTopK);
  if (h.kind == FrameKind::f2a) h.ffn_us = get<uint32_t>(data, kOffFfnUs);
  if (h.kind == FrameKind::a2f) h.epoch = get<uint32_t>(data, kOffEpoch);
  if (h.kind != FrameKind::f2a && h.kind != FrameKind::a2f && get<uint32_t>(data, kOffFfnUs) != 0) {
    return corrupt_data(where(h) + " has header bytes 36..39 set (only a2f and f2a frames use them)");
  }
  h.payload_bytes = get<uint64_t>(data, kOffPayloadBytes);
  h.payload_checksum = get<uint64_t>(data, kOffPayloadSum);
  if (h.flags & ~kFlagPayloadChecksum) return corrupt_data(where(h) + " has unknown flags");
  if (!(h.flags & kFlagPayloadChecksum) && h.payload_checksum != 0) {
    return corrupt_data(where(h) + " has a payload checksum but not the flag that says so");
  }
  if (h.payload_bytes != len - kFrameHeaderBytes) {
    return corrupt_data(where(h) + " announces " + std::to_string(h.payload_bytes) + " payload bytes but " +
                        std::to_string(len - kFrameHeaderBytes) + " arrived");
  }
  // The payload size each kind implies.
  uint64_t expect = 0;
  switch (h.kind) {
    case FrameKind::hello:
    case FrameKind::hello_ack:
      expect = kHandshakeBytes;
      break;
    case FrameKind::refuse:
    case FrameKind::error:
      if (h.payload_bytes > kMaxReasonBytes) return corrupt_data(where(h) + " reason longer than 4096 bytes");
      expect = h.payload_bytes;
      break;
    case FrameKind::a2f: {
      // Bound sizes before multiplying: 2^24 tokens x 2^20 channels cannot overflow 64 bits.
      if (h.n_tokens > (1u << 24) || h.hidden > (1u << 20) || h.top_k > 1024) {
        return corrupt_data(where(h) + " has implausible sizes (n_tokens " + std::to_string(h.n_tokens) +
                            ", hidden " + std::to_string(h.hidden) + ", top_k " + std::to_string(h.top_k) + ")");
      }
      auto l = a2f_layout(h.n_tokens, h.hidden, h.top_k, h.granularity);
      if (!l.ok()) return corrupt_data(where(h) + ": " + l.status().message());
      expect = l->total;
      break;
    }
    case FrameKind::f2a:
      if (h.n_tokens > (1u << 24) || h.hidden > (1u << 20)) {
        return corrupt_data(where(h) + " has implausible sizes");
      }
      expect = f2a_payload_bytes(h.n_tokens, h.hidden);
      break;
    case FrameKind::ping:
    case FrameKind::pong:
      expect = 0;
      break;
  }
  if (h.payload_bytes != expect) {
    return corrupt_data(where(h) + " payload is " + std::to_string(h.payload_bytes) + " bytes, its header implies " +
                        std::to_string(expect));
  }
  if ((h.flags & kFlagPayloadChecksum) &&
      hash64(data + kFrameHeaderBytes, h.payload_bytes) != h.payload_checksum) {
    return corrupt_data(where(h) + " payload checksum mismatch");
  }
  return h;
}

Result<A2fView> decode_a2f(const uint8_t* data, size_t len, const A2fLimits& lim) {
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0) return invalid_argument("a2f frame buffer is not 8-byte aligned");
  AFD_ASSIGN_OR_RETURN(FrameHeader h, decode_header(data, len));
  if (h.kind != FrameKind::a2f) return corrupt_data("expected an a2f frame, got " + where(h));
  if (h.hidden != lim.hidden) {
    return corrupt_data(where(h) + " has hidden " + std::to_string(h.hidden) + ", the model has " + std::to_string(lim.hidden));
  }
  if (h.top_k != lim.top_k && h.top_k != 0) {
    return corrupt_data(where(h) + " has top_k " + std::to_string(h.top_k) + ", the model has " + std::to_string(lim.top_k));
  }
  if (h.n_tokens > lim.max_tokens) {
    return corrupt_data(where(h) + " carries " + std::to_string(h.n_tokens) + " tokens, more than the " +
                        std::to_string(lim.max_tokens) + " agreed in the handshake");
  }
  auto l = a2f_layout(h.n_tokens, h.hidden, h.top_k, h.granularity);
  if (!l.ok()) return corrupt_data(where(h) + ": " + l.status().message());
  const uint8_t* p = data + kFrameHeaderBytes;
  A2fView v;
  v.header = h;
  v.q = p + l->q;
  v.scales = reinterpret_cast<const float*>(p + l->scales);
  v.ids = reinterpret_cast<const int32_t*>(p + l->ids);
  v.weights = reinterpret_cast<const float*>(p + l->weights);
  v.group = h.hidden / l->n_scales_per_token;
  size_t n_scales = static_cast<size_t>(h.n_tokens) * static_cast<size_t>(l->n_scales_per_token);
  for (size_t i = 0; i < n_scales; ++i) {
    float s = v.scales[i];
    if (!(std::isfinite(s) && s > 0.0f)) {
      return corrupt_data(where(h) + " has scale " + std::to_string(s) + " at index " + std::to_string(i) +
                          " (scales must be finite and positive)");
    }
  }
  size_t n_routes = static_cast<size_t>(h.n_tokens) * h.top_k;
  for (size_t i = 0; i < n_routes; ++i) {
    int32_t e = v.ids[i];
    if (e == -1 && lim.unrouted_ids) continue;
    if (e < 0 || static_cast<uint32_t>(e) >= lim.n_experts) {
      return corrupt_data(where(h) + " routes token " + std::to_string(i / h.top_k) + " to expert " + std::to_string(e) +
                          ", outside [0, " + std::to_string(lim.n_experts) + ")");
    }
    if (!std::isfinite(v.weights[i])) {
      return corrupt_data(where(h) + " has a non-finite routing weight for token " + std::to_string(i / h.top_k));
    }
  }
  return v;
}

Result<F2aView> decode_f2a(const uint8_t* data, size_t len, uint32_t hidden, uint32_t expect_tokens) {
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0) return invalid_argument("f2a frame buffer is not 8-byte aligned");
  AFD_ASSIGN_OR_RETURN(FrameHeader h, decode_header(data, len));
  if (h.kind != FrameKind::f2a) return corrupt_data("expected an f2a frame, got " + where(h));
  if (h.hidden != hidden) {
    return corrupt_data(where(h) + " has hidden " + std::to_string(h.hidden) + ", expected " + std::to_string(hidden));
  }
  if (h.n_tokens != expect_tokens) {
    return corrupt_data(where(h) + " carries " + std::to_string(h.n_tokens) + " tokens, " +
                        std::to_string(expect_tokens) + " were dispatched");
  }
  F2aView v;
  v.header = h;
  v.out = reinterpret_cast<const uint16_t*>(data + kFrameHeaderBytes);
  return v;
}

// Handshake payload offsets (docs/PROTOCOL.md, "Handshake").
size_t encode_handshake(FrameKind kind, const Handshake& s, uint8_t* out) {
  uint8_t* p = out + kFrameHeaderBytes;
  std::memset(p, 0, kHandshakeBytes);
  put<uint64_t>(p, 0, s.fingerprint);
  put<uint8_t>(p, 8, static_cast<uint8_t>(s.role));
  put<uint8_t>(p, 9, static_cast<uint8_t>(s.granularity));
  put<uint8_t>(p, 10, s.holds_shared);
  put<uint8_t>(p, 11, static_cast<uint8_t>(s.precision));
  put<uint16_t>(p, 12, s.index);
  put<uint16_t>(p, 14, s.n_attention);
  put<uint16_t>(p, 16, s.n_ffn);
  put<uint16_t>(p, 18, s.n_microbatches);
  put<uint32_t>(p, 20, s.expert_begin);
  put<uint32_t>(p, 24, s.expert_end);
  put<uint32_t>(p, 28, s.n_layers);
  put<uint32_t>(p, 32, s.n_experts);
  put<uint32_t>(p, 36, s.hidden);
  put<uint32_t>(p, 40, s.top_k);
  put<uint32_t>(p, 44, s.max_tokens);
  put<uint16_t>(p, 48, s.tp_rank);
  put<uint16_t>(p, 50, s.tp_degree);
  put<uint32_t>(p, 52, s.epoch);
  put<uint16_t>(p, 56, s.n_parts);
  put<uint16_t>(p, 58, s.part_begin);
  put<uint16_t>(p, 60, s.part_end);
  put<uint8_t>(p, 62, s.batch_invariant);
  put<uint8_t>(p, 63, s.placement);
  FrameHeader h;
  h.kind = kind;
  h.payload_bytes = kHandshakeBytes;
  h.flags = kFlagPayloadChecksum;
  encode_header(h, p, out);
  return kFrameHeaderBytes + kHandshakeBytes;
}

Result<Handshake> decode_handshake(const uint8_t* data, size_t len, FrameKind expect) {
  AFD_ASSIGN_OR_RETURN(FrameHeader h, decode_header(data, len));
  if (h.kind == FrameKind::refuse) {
    auto r = decode_reason(data, len);
    return unavailable("peer refused the handshake: " + (r.ok() ? *r : r.status().message()));
  }
  if (h.kind != expect) {
    return corrupt_data(std::string("expected a ") + frame_kind_name(expect) + " frame, got " + frame_kind_name(h.kind));
  }
  const uint8_t* p = data + kFrameHeaderBytes;
  Handshake s;
  s.fingerprint = get<uint64_t>(p, 0);
  uint8_t role = get<uint8_t>(p, 8);
  uint8_t gran = get<uint8_t>(p, 9);
  if (role > 1) return corrupt_data("handshake has unknown role " + std::to_string(role));
  if (gran < 1 || gran > 2) return corrupt_data("handshake has unknown scale granularity " + std::to_string(gran));
  s.role = static_cast<Role>(role);
  s.granularity = static_cast<ScaleGranularity>(gran);
  s.holds_shared = get<uint8_t>(p, 10);
  const uint8_t prec = get<uint8_t>(p, 11);
  if (prec < 1 || prec > 2) return corrupt_data("handshake has unknown activation precision " + std::to_string(prec));
  s.precision = static_cast<WirePrecision>(prec);
  s.index = get<uint16_t>(p, 12);
  s.n_attention = get<uint16_t>(p, 14);
  s.n_ffn = get<uint16_t>(p, 16);
  s.n_microbatches = get<uint16_t>(p, 18);
  s.expert_begin = get<uint32_t>(p, 20);
  s.expert_end = get<uint32_t>(p, 24);
  s.n_layers = get<uint32_t>(p, 28);
  s.n_experts = get<uint32_t>(p, 32);
  s.hidden = get<uint32_t>(p, 36);
  s.top_k = get<uint32_t>(p, 40);
  s.max_tokens = get<uint32_t>(p, 44);
  s.tp_rank = get<uint16_t>(p, 48);
  s.tp_degree = get<uint16_t>(p, 50);
  s.epoch = get<uint32_t>(p, 52);
  s.n_parts = get<uint16_t>(p, 56);
  s.part_begin = get<uint16_t>(p, 58);
  s.part_end = get<uint16_t>(p, 60);
  s.batch_invariant = get<uint8_t>(p, 62);
  if (s.batch_invariant > 1)
    return corrupt_data("handshake has unknown batch-invariant flag " + std::to_string(s.batch_invariant));
  s.placement = get<uint8_t>(p, 63);
  if (s.placement > 1) return corrupt_data("handshake has unknown placement flag " + std::to_string(s.placement));
  if (s.role == Role::ffn && (s.tp_degree < 1 || s.tp_degree > 64 || s.tp_rank >= s.tp_degree)) {
    return corrupt_data("handshake has TP rank " + std::to_string(s.tp_rank) + " of degree " +
                        std::to_string(s.tp_degree) + " (need rank < degree <= 64)");
  }
  if (s.role == Role::attention && (s.tp_degree > 64 || s.tp_rank != 0)) {
    return corrupt_data("attention handshake expects TP degree " + std::to_string(s.tp_degree) + " (0..64), rank " +
                        std::to_string(s.tp_rank) + " (must be 0)");
  }
  if (s.holds_shared > 1) return corrupt_data("handshake has holds_shared " + std::to_string(s.holds_shared));
  uint16_t n_role = s.role == Role::attention ? s.n_attention : s.n_ffn;
  if (n_role == 0 || s.index >= n_role) {
    return corrupt_data("handshake index " + std::to_string(s.index) + " is outside its role's count " + std::to_string(n_role));
  }
  if (s.expert_begin > s.expert_end || s.expert_end > s.n_experts) {
    return corrupt_data("handshake expert range [" + std::to_string(s.expert_begin) + ", " +
                        std::to_string(s.expert_end) + ") is outside [0, " + std::to_string(s.n_experts) + ")");
  }
  if (s.placement) {
    if (s.epoch == 0 || s.n_parts != 0 || s.part_begin != 0 || s.part_end != 0 || s.expert_begin != 0 ||
        s.expert_end != s.n_experts)
      return corrupt_data("handshake of an expert placement must be of an epoch >= 1, name no parts and hold experts [0, " +
                          std::to_string(s.n_experts) + ")");
  } else if (s.epoch > 0) {
    // Parts of an explicit assignment, and the experts they are (the same thing twice).
    if (s.n_parts < 1 || s.n_parts > 64 || s.part_begin >= s.part_end || s.part_end > s.n_parts) {
      return corrupt_data("handshake assigns parts [" + std::to_string(s.part_begin) + ", " +
                          std::to_string(s.part_end) + ") of " + std::to_string(s.n_parts) + " (need begin < end <= n <= 64)");
    }
    const uint64_t E = s.n_experts, P = s.n_parts;
    if (s.expert_begin != s.part_begin * E / P || s.expert_end != s.part_end * E / P ||
        (s.holds_shared != 0) != (s.part_begin == 0)) {
      return corrupt_data("handshake assigns parts [" + std::to_string(s.part_begin) + ", " +
                          std::to_string(s.part_end) + ") of " + std::to_string(s.n_parts) + " but experts [" +
                          std::to_string(s.expert_begin) + ", " + std::to_string(s.expert_end) + ")" +
                          (s.holds_shared ? " + shared" : ""));
    }
  } else if (s.n_parts != 0 || s.part_begin != 0 || s.part_end != 0) {
    return corrupt_data("handshake of epoch 0 (the start-up shard) names parts");
  }
  if (s.role == Role::attention && (s.n_microbatches < 1 || s.n_microbatches > 16)) {
    return corrupt_data("handshake asks for " + std::to_string(s.n_microbatches) + " micro-batches (1..16)");
  }
  return s;
}

size_t encode_reason(FrameKind kind, uint32_t layer, uint16_t microbatch, uint64_t step, const std::string& reason,
                     uint8_t* out) {
  size_t n = std::min(reason.size(), kMaxReasonBytes);
  std::memcpy(out + kFrameHeaderBytes, reason.data(), n);
  FrameHeader h;
  h.kind = kind;
  h.layer = layer;
  h.microbatch = microbatch;
  h.step = step;
  h.payload_bytes = n;
  h.flags = kFlagPayloadChecksum;
  encode_header(h, out + kFrameHeaderBytes, out);
  return kFrameHeaderBytes + n;
}

Result<std::string> decode_reason(const uint8_t* data, size_t len) {
  AFD_ASSIGN_OR_RETURN(FrameHeader h, decode_header(data, len));
  if (h.kind != FrameKind::refuse && h.kind != FrameKind::error) {
    return corrupt_data(std::string("expected a refuse or error frame, got ") + frame_kind_name(h.kind));
  }
  std::string r(reinterpret_cast<const char*>(data + kFrameHeaderBytes), h.payload_bytes);
  for (char& c : r) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') c = '?';
  }
  return r;
}

size_t encode_probe(FrameKind kind, uint64_t seq, uint8_t* out) {
  FrameHeader h;
  h.kind = kind;
  h.step = seq;
  encode_header(h, nullptr, out);
  return kFrameHeaderBytes;
}

Result<uint64_t> decode_probe(const uint8_t* data, size_t len, FrameKind expect) {
  AFD_ASSIGN_OR_RETURN(FrameHeader h, decode_header(data, len));
  if (h.kind != expect) {
    return corrupt_data(std::string("expected a ") + frame_kind_name(expect) + " frame, got " + where(h));
  }
  return h.step;
}

const char* wire_precision_name(WirePrecision p) {
  switch (p) {
    case WirePrecision::f32: return "reference (f32 activations)";
    case WirePrecision::bf16: return "fast (bf16 activations)";
  }
  return "?";
}

std::string describe(const Handshake& h) {
  std::string s = h.role == Role::attention ? "attention " : "ffn ";
  s += std::to_string(h.index) + " of " + std::to_string(h.n_attention) + "A" + std::to_string(h.n_ffn) + "F";
  if (h.role == Role::ffn) {
    s += ", experts [" + std::to_string(h.expert_begin) + ", " + std::to_string(h.expert_end) + ")";
    if (h.holds_shared) s += " + shared/dense";
    if (h.tp_degree > 1) s += ", TP rank " + std::to_string(h.tp_rank) + "/" + std::to_string(h.tp_degree);
  }
  if (h.batch_invariant) s += ", deterministic";
  if (h.placement) {
    s += ", assignment epoch " + std::to_string(h.epoch) + " (expert placement: the pairs each frame names" +
         (h.holds_shared ? std::string(" + shared/dense") : std::string()) + ")";
  } else if (h.epoch > 0) {
    s += ", assignment epoch " + std::to_string(h.epoch) + " (parts [" + std::to_string(h.part_begin) + ", " +
         std::to_string(h.part_end) + ") of " + std::to_string(h.n_parts);
    if (h.role == Role::attention) {
      s += ": experts [" + std::to_string(h.expert_begin) + ", " + std::to_string(h.expert_end) + ")" +
           (h.holds_shared ? " + shared/dense" : "");
    }
    s += ")";
  }
  s += std::string(", precision ") + wire_precision_name(h.precision);
  char fp[32];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(h.fingerprint));
  s += ", model " + std::string(fp);
  return s;
}

Status check_handshake_match(const Handshake& mine, const Handshake& theirs) {
  auto fail = [&](const std::string& what) {
    return invalid_argument("handshake mismatch: " + what + " (local: " + describe(mine) + "; peer: " + describe(theirs) + ")");
  };
  if (mine.fingerprint != theirs.fingerprint) return fail("model fingerprints differ (different model or config)");
  if (mine.role == theirs.role) return fail("both sides have the same role");
  // Neither n_ffn nor n_attention is compared: the set of FFN workers and the set of attention
  // workers may change while the deployment runs (the attention side's hello says what each FFN
  // worker holds; an FFN worker serves every attention worker whose index no other one it
  // serves has, however many there are).
  if (mine.hidden != theirs.hidden || mine.top_k != theirs.top_k || mine.n_experts != theirs.n_experts ||
      mine.n_layers != theirs.n_layers) {
    return fail("model shapes differ");
  }
  const Handshake& a = mine.role == Role::attention ? mine : theirs;
  const Handshake& f = mine.role == Role::attention ? theirs : mine;
  if (a.precision != f.precision) {
    return fail(std::string("precision differs: the attention worker runs --precision ") +
                wire_precision_name(a.precision) + ", the FFN worker --precision " + wire_precision_name(f.precision));
  }
  if (a.batch_invariant != f.batch_invariant) {
    return fail(std::string("batch-invariant mode differs: the attention worker runs ") +
                (a.batch_invariant ? "with" : "without") + " --deterministic, the FFN worker " +
                (f.batch_invariant ? "with" : "without"));
  }
  // The attention side's expected TP degree (0: any) against the FFN side's.
  if (a.tp_degree != 0 && a.tp_degree != f.tp_degree) {
    return fail("the attention side expects FFN TP degree " + std::to_string(a.tp_degree) + ", the FFN worker has " +
                std::to_string(f.tp_degree));
  }
  return Status();
}

}  // namespace afd::comm
