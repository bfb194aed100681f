// Protocol: round trips, every validation path, and a fuzz-style test that mutates
// valid frames randomly and checks decoding returns errors without crashing.
#include <gtest/gtest.h>

#include <functional>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/protocol.h"
#include "core/dtype.h"

namespace afd::comm {
namespace {

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : words((n + 7) / 8 + 1) {}
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
  std::vector<uint64_t> words;
};

// Builds a valid a2f frame of n tokens; returns its length.
size_t build_a2f(AlignedBuf& buf, uint32_t n, uint32_t hidden, uint32_t k, ScaleGranularity g, uint32_t n_experts,
                 std::mt19937& rng, bool payload_sum = false) {
  auto l = a2f_layout(n, hidden, k, g);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  uint8_t* p = buf.data() + kFrameHeaderBytes;
  std::uniform_real_distribution<float> u(-3, 3);
  int64_t group = hidden / l->n_scales_per_token;
  for (uint32_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < l->n_scales_per_token; ++b) {
      float amax = 0;
      std::vector<float> x(group);
      for (auto& v : x) { v = u(rng); amax = std::max(amax, std::fabs(v)); }
      float scale = amax / kFp8E4M3Max;
      reinterpret_cast<float*>(p + l->scales)[i * l->n_scales_per_token + b] = scale;
      for (int64_t c = 0; c < group; ++c) p[l->q + i * hidden + b * group + c] = f32_to_fp8_e4m3(x[c] / scale);
    }
    for (uint32_t j = 0; j < k; ++j) {
      reinterpret_cast<int32_t*>(p + l->ids)[i * k + j] = static_cast<int32_t>((i * 7 + j * 3) % n_experts);
      reinterpret_cast<float*>(p + l->weights)[i * k + j] = 1.0f / static_cast<float>(k);
    }
  }
  FrameHeader h;
  h.kind = FrameKind::a2f;
  h.granularity = g;
  h.layer = 5;
  h.microbatch = 2;
  h.step = 77;
  h.n_tokens = n;
  h.hidden = hidden;
  h.top_k = k;
  h.payload_bytes = l->total;
  if (payload_sum) h.flags = kFlagPayloadChecksum;
  encode_header(h, p, buf.data());
  return kFrameHeaderBytes + l->total;
}

TEST(Protocol, A2fRoundTripPerTokenAndPerBlock) {
  std::mt19937 rng(1);
  for (auto g : {ScaleGranularity::per_token, ScaleGranularity::per_block}) {
    AlignedBuf buf(1 << 20);
    size_t len = build_a2f(buf, 9, 256, 4, g, 16, rng);
    A2fLimits lim{256, 4, 16, 64};
    auto v = decode_a2f(buf.data(), len, lim);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->header.n_tokens, 9u);
    EXPECT_EQ(v->header.layer, 5u);
    EXPECT_EQ(v->header.microbatch, 2);
    EXPECT_EQ(v->header.step, 77u);
    EXPECT_EQ(v->group, g == ScaleGranularity::per_token ? 256 : 128);
    EXPECT_EQ(v->ids[4 * 3 + 1], static_cast<int32_t>((3 * 7 + 3) % 16));
    EXPECT_FLOAT_EQ(v->weights[5], 0.25f);
  }
}

TEST(Protocol, EmptyFrameIsValid) {
  std::mt19937 rng(1);
  AlignedBuf buf(256);
  size_t len = build_a2f(buf, 0, 64, 2, ScaleGranularity::per_token, 4, rng);
  EXPECT_EQ(len, kFrameHeaderBytes);
  auto v = decode_a2f(buf.data(), len, A2fLimits{64, 2, 4, 8});
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->header.n_tokens, 0u);
}

TEST(Protocol, LimitsAreEnforced) {
  std::mt19937 rng(2);
  AlignedBuf buf(1 << 16);
  size_t len = build_a2f(buf, 4, 128, 2, ScaleGranularity::per_token, 8, rng);
  EXPECT_EQ(decode_a2f(buf.data(), len, A2fLimits{256, 2, 8, 8}).status().code(), StatusCode::corrupt_data);
  EXPECT_EQ(decode_a2f(buf.data(), len, A2fLimits{128, 3, 8, 8}).status().code(), StatusCode::corrupt_data);
  EXPECT_EQ(decode_a2f(buf.data(), len, A2fLimits{128, 2, 8, 3}).status().code(), StatusCode::corrupt_data);
  // Expert id out of range for a smaller model.
  auto s = decode_a2f(buf.data(), len, A2fLimits{128, 2, 2, 8}).status();
  EXPECT_EQ(s.code(), StatusCode::corrupt_data);
  EXPECT_NE(s.message().find("expert"), std::string::npos) << s.message();
  // Wrong length: one byte short / long.
  EXPECT_EQ(decode_a2f(buf.data(), len - 1, A2fLimits{128, 2, 8, 8}).status().code(), StatusCode::corrupt_data);
  EXPECT_EQ(decode_a2f(buf.data(), len + 8, A2fLimits{128, 2, 8, 8}).status().code(), StatusCode::corrupt_data);
  // Misaligned buffer is the caller's bug but still an error, not a crash.
  EXPECT_FALSE(decode_a2f(buf.data() + 1, len, A2fLimits{128, 2, 8, 8}).ok());
}

TEST(Protocol, F2aCarriesTheFfnTime) {
  AlignedBuf buf(1 << 12);
  FrameHeader h;
  h.kind = FrameKind::f2a;
  h.layer = 3;
  h.n_tokens = 2;
  h.hidden = 8;
  h.ffn_us = 123456;
  h.payload_bytes = f2a_payload_bytes(2, 8);
  std::memset(buf.data() + kFrameHeaderBytes, 0, h.payload_bytes);
  encode_header(h, buf.data() + kFrameHeaderBytes, buf.data());
  auto d = decode_header(buf.data(), kFrameHeaderBytes + h.payload_bytes);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->ffn_us, 123456u);
  EXPECT_EQ(d->epoch, 0u);  // bytes 36..39 are the compute time in an f2a frame
  EXPECT_EQ(d->layer, 3u);
}

// Version 4: an a2f frame carries the assignment epoch it was built for (header bytes 36..39,
// which an f2a frame uses for its compute time).
TEST(Protocol, A2fCarriesTheAssignmentEpoch) {
  AlignedBuf buf(1 << 12);
  FrameHeader h;
  h.kind = FrameKind::a2f;
  h.granularity = ScaleGranularity::per_token;
  h.epoch = 7;
  h.ffn_us = 99;  // not an a2f field: not written
  h.hidden = 8;
  h.payload_bytes = 0;
  encode_header(h, nullptr, buf.data());
  auto d = decode_header(buf.data(), kFrameHeaderBytes);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->epoch, 7u);
  EXPECT_EQ(d->ffn_us, 0u);
  uint32_t raw;
  std::memcpy(&raw, buf.data() + 36, 4);
  EXPECT_EQ(raw, 7u);
}

TEST(Protocol, BadScaleAndWeightAreRejected) {
  std::mt19937 rng(3);
  AlignedBuf buf(1 << 16);
  size_t len = build_a2f(buf, 2, 128, 2, ScaleGranularity::per_token, 8, rng);
  auto l = *a2f_layout(2, 128, 2, ScaleGranularity::per_token);
  uint8_t* p = buf.data() + kFrameHeaderBytes;
  // Re-seal after each mutation so only the semantic check can catch it.
  FrameHeader h = *decode_header(buf.data(), len);
  reinterpret_cast<float*>(p + l.scales)[1] = -1.0f;
  encode_header(h, p, buf.data());
  EXPECT_EQ(decode_a2f(buf.data(), len, A2fLimits{128, 2, 8, 8}).status().code(), StatusCode::corrupt_data);
  reinterpret_cast<float*>(p + l.scales)[1] = 1.0f;
  reinterpret_cast<float*>(p + l.weights)[3] = NAN;
  encode_header(h, p, buf.data());
  EXPECT_EQ(decode_a2f(buf.data(), len, A2fLimits{128, 2, 8, 8}).status().code(), StatusCode::corrupt_data);
}

TEST(Protocol, HeaderChecksumCatchesEveryByteFlip) {
  std::mt19937 rng(4);
  AlignedBuf buf(1 << 16);
  size_t len = build_a2f(buf, 3, 64, 2, ScaleGranularity::per_token, 8, rng);
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    for (uint8_t bit = 1; bit != 0; bit = static_cast<uint8_t>(bit << 1)) {
      buf.data()[i] ^= bit;
      auto h = decode_header(buf.data(), len);
      EXPECT_FALSE(h.ok()) << "flip of bit " << int(bit) << " in header byte " << i << " went unnoticed";
      buf.data()[i] ^= bit;
    }
  }
  EXPECT_TRUE(decode_header(buf.data(), len).ok());
}

TEST(Protocol, PayloadChecksumWhenFlagged) {
  std::mt19937 rng(5);
  AlignedBuf buf(1 << 16);
  size_t len = build_a2f(buf, 3, 64, 2, ScaleGranularity::per_token, 8, rng, /*payload_sum=*/true);
  ASSERT_TRUE(decode_header(buf.data(), len).ok());
  buf.data()[kFrameHeaderBytes + 10] ^= 0x10;
  auto s = decode_header(buf.data(), len).status();
  EXPECT_EQ(s.code(), StatusCode::corrupt_data);
  EXPECT_NE(s.message().find("payload checksum"), std::string::npos);
}

TEST(Protocol, VersionMismatchIsNamed) {
  std::mt19937 rng(6);
  AlignedBuf buf(1 << 12);
  size_t len = build_a2f(buf, 1, 64, 1, ScaleGranularity::per_token, 8, rng);
  uint16_t v = 9;
  std::memcpy(buf.data() + 4, &v, 2);
  auto s = decode_header(buf.data(), len).status();
  EXPECT_NE(s.message().find("version 9"), std::string::npos) << s.message();
}

TEST(Protocol, F2aRoundTrip) {
  AlignedBuf buf(1 << 12);
  FrameHeader h;
  h.kind = FrameKind::f2a;
  h.layer = 3;
  h.n_tokens = 5;
  h.hidden = 64;
  h.payload_bytes = f2a_payload_bytes(5, 64);
  auto* out = reinterpret_cast<uint16_t*>(buf.data() + kFrameHeaderBytes);
  for (int i = 0; i < 5 * 64; ++i) out[i] = f32_to_bf16(static_cast<float>(i) * 0.5f).bits;
  encode_header(h, nullptr, buf.data());
  size_t len = kFrameHeaderBytes + h.payload_bytes;
  auto v = decode_f2a(buf.data(), len, 64, 5);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_FLOAT_EQ(bf16_to_f32(v->out[7]), 3.5f);
  EXPECT_FALSE(decode_f2a(buf.data(), len, 64, 4).ok());
  EXPECT_FALSE(decode_f2a(buf.data(), len, 128, 5).ok());
}

TEST(Protocol, ProbeRoundTrip) {
  AlignedBuf buf(1 << 8);
  ASSERT_EQ(encode_probe(FrameKind::ping, 0x1234567890ull, buf.data()), kFrameHeaderBytes);
  auto seq = decode_probe(buf.data(), kFrameHeaderBytes, FrameKind::ping);
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  EXPECT_EQ(*seq, 0x1234567890ull);
  // A ping is not a pong; a probe with a payload, or a flipped bit, is corrupt.
  auto wrong = decode_probe(buf.data(), kFrameHeaderBytes, FrameKind::pong);
  EXPECT_EQ(wrong.status().code(), StatusCode::corrupt_data);
  EXPECT_NE(wrong.status().message().find("expected a pong frame, got ping"), std::string::npos)
      << wrong.status().message();
  EXPECT_FALSE(decode_probe(buf.data(), kFrameHeaderBytes + 8, FrameKind::ping).ok());
  buf.data()[20] ^= 1;
  EXPECT_FALSE(decode_probe(buf.data(), kFrameHeaderBytes, FrameKind::ping).ok());
  // A data frame on the probe tag is refused too.
  encode_probe(FrameKind::pong, 7, buf.data());
  EXPECT_FALSE(decode_f2a(buf.data(), kFrameHeaderBytes, 64, 0).ok());
}

// The payload checksum field is hash64(payload) with the flag, and 0 without it: a frame
// that fills it without the flag is refused, not read loosely (found by fuzz_frames).
TEST(Protocol, PayloadChecksumWithoutItsFlagIsCorrupt) {
  AlignedBuf buf(1 << 8);
  encode_probe(FrameKind::pong, 3, buf.data());
  uint64_t bogus = 0x4b0000;
  std::memcpy(buf.data() + 48, &bogus, 8);
  uint64_t hs = hash64(buf.data(), 56);
  std::memcpy(buf.data() + 56, &hs, 8);  // an honest header checksum over it
  auto s = decode_header(buf.data(), kFrameHeaderBytes).status();
  EXPECT_EQ(s.code(), StatusCode::corrupt_data);
  EXPECT_NE(s.message().find("payload checksum but not the flag"), std::string::npos) << s.message();
}

Handshake attention_hs() {
  Handshake h;
  h.fingerprint = 0x1234;
  h.role = Role::attention;
  h.index = 1;
  h.n_attention = 2;
  h.n_ffn = 1;
  h.n_layers = 4;
  h.n_experts = 8;
  h.hidden = 64;
  h.top_k = 2;
  h.max_tokens = 32;
  h.n_microbatches = 3;
  return h;
}

TEST(Protocol, HandshakeRoundTripAndMismatch) {
  AlignedBuf buf(256);
  Handshake a = attention_hs();
  size_t len = encode_handshake(FrameKind::hello, a, buf.data());
  auto d = decode_handshake(buf.data(), len, FrameKind::hello);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->fingerprint, 0x1234u);
  EXPECT_EQ(d->index, 1);
  EXPECT_EQ(d->n_microbatches, 3);
  EXPECT_EQ(d->max_tokens, 32u);
  EXPECT_FALSE(decode_handshake(buf.data(), len, FrameKind::hello_ack).ok());

  Handshake f = a;
  f.role = Role::ffn;
  f.index = 0;
  f.expert_begin = 0;
  f.expert_end = 8;
  f.holds_shared = 1;
  EXPECT_TRUE(check_handshake_match(a, f).is_ok());
  f.fingerprint = 0x9999;
  auto s = check_handshake_match(a, f);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("fingerprint"), std::string::npos) << s.message();
  f.fingerprint = a.fingerprint;
  // Neither y nor x is compared (FFN and attention workers may join and leave while the
  // deployment runs): an attention worker started as index 2 of 3 is served by FFN workers
  // started for 2, and the other way round.
  f.n_ffn = 2;
  EXPECT_TRUE(check_handshake_match(a, f).is_ok());
  f.n_attention = 3;
  EXPECT_TRUE(check_handshake_match(a, f).is_ok());
  EXPECT_TRUE(check_handshake_match(f, a).is_ok());
}

// The hello of `a` with payload byte `offset` set to `v` (checksums recomputed), decoded.
Result<Handshake> decode_with_byte(const Handshake& a, size_t offset, uint8_t v) {
  AlignedBuf buf(256);
  size_t len = encode_handshake(FrameKind::hello, a, buf.data());
  buf.data()[kFrameHeaderBytes + offset] = v;
  FrameHeader h;
  h.kind = FrameKind::hello;
  h.payload_bytes = kHandshakeBytes;
  h.flags = kFlagPayloadChecksum;
  encode_header(h, buf.data() + kFrameHeaderBytes, buf.data());  // checksums over the changed byte
  return decode_handshake(buf.data(), len, FrameKind::hello);
}

// Version 5: both sides announce their activation precision (--precision); a difference is a
// mismatch that names the field and both values, whichever side checks; a value outside the
// enum is a corrupt frame.
TEST(Protocol, HandshakeCarriesThePrecision) {
  AlignedBuf buf(256);
  Handshake a = attention_hs();
  for (WirePrecision p : {WirePrecision::f32, WirePrecision::bf16}) {
    a.precision = p;
    size_t len = encode_handshake(FrameKind::hello, a, buf.data());
    auto d = decode_handshake(buf.data(), len, FrameKind::hello);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->precision, p);
  }
  for (uint8_t bad : {uint8_t{0}, uint8_t{3}, uint8_t{255}}) {
    auto d = decode_with_byte(a, 11, bad);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::corrupt_data);
    EXPECT_NE(d.status().message().find("precision " + std::to_string(bad)), std::string::npos) << d.status().message();
  }
  a.precision = WirePrecision::f32;
  Handshake f = a;
  f.role = Role::ffn;
  f.index = 0;
  f.expert_end = 8;
  f.holds_shared = 1;
  EXPECT_TRUE(check_handshake_match(a, f).is_ok());
  f.precision = WirePrecision::bf16;
  for (const Status& s : {check_handshake_match(a, f), check_handshake_match(f, a)}) {
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    EXPECT_NE(s.message().find("precision differs: the attention worker runs --precision reference (f32 activations), "
                               "the FFN worker --precision fast (bf16 activations)"),
              std::string::npos)
        << s.message();
  }
}

// Version 6: both sides announce batch-invariant mode (--deterministic); a difference is a
// mismatch naming both sides' mode, whichever side checks; a value other than 0 or 1 is a
// corrupt frame.
TEST(Protocol, HandshakeCarriesBatchInvariantMode) {
  AlignedBuf buf(256);
  Handshake a = attention_hs();
  for (uint8_t v : {uint8_t{0}, uint8_t{1}}) {
    a.batch_invariant = v;
    size_t len = encode_handshake(FrameKind::hello, a, buf.data());
    auto d = decode_handshake(buf.data(), len, FrameKind::hello);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->batch_invariant, v);
  }
  for (uint8_t bad : {uint8_t{2}, uint8_t{255}}) {
    auto d = decode_with_byte(a, 62, bad);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::corrupt_data);
    EXPECT_NE(d.status().message().find("batch-invariant flag " + std::to_string(bad)), std::string::npos)
        << d.status().message();
  }
  a.batch_invariant = 1;
  Handshake f = a;
  f.role = Role::ffn;
  f.index = 0;
  f.expert_end = 8;
  f.holds_shared = 1;
  EXPECT_TRUE(check_handshake_match(a, f).is_ok());
  f.batch_invariant = 0;
  for (const Status& s : {check_handshake_match(a, f), check_handshake_match(f, a)}) {
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    EXPECT_NE(s.message().find("batch-invariant mode differs: the attention worker runs with --deterministic, the "
                               "FFN worker without"),
              std::string::npos)
        << s.message();
  }
}

// Version 4: the attention hello carries an expert assignment and its epoch; the ack echoes
// the epoch with the range the FFN worker now holds.
TEST(Protocol, HandshakeCarriesTheAssignmentEpoch) {
  AlignedBuf buf(256);
  Handshake a = attention_hs();  // 8 experts
  a.epoch = 3;
  a.n_parts = 4;
  a.part_begin = 0;
  a.part_end = 3;
  a.expert_begin = 0;
  a.expert_end = 6;
  a.holds_shared = 1;
  size_t len = encode_handshake(FrameKind::hello, a, buf.data());
  EXPECT_EQ(len, kFrameHeaderBytes + 64);
  auto d = decode_handshake(buf.data(), len, FrameKind::hello);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->epoch, 3u);
  EXPECT_EQ(d->n_parts, 4);
  EXPECT_EQ(d->part_begin, 0);
  EXPECT_EQ(d->part_end, 3);
  EXPECT_EQ(d->expert_begin, 0u);
  EXPECT_EQ(d->expert_end, 6u);
  EXPECT_EQ(d->holds_shared, 1);
  EXPECT_NE(describe(*d).find("assignment epoch 3 (parts [0, 3) of 4: experts [0, 6) + shared/dense)"),
            std::string::npos)
      << describe(*d);
  // Parts and experts must say the same; parts must be a range within n_parts; epoch 0 has none.
  for (auto bad : std::vector<std::function<void(Handshake&)>>{
           [](Handshake& h) { h.expert_end = 5; },
           [](Handshake& h) { h.holds_shared = 0; },
           [](Handshake& h) { h.part_end = 5; },
           [](Handshake& h) { h.part_begin = 3; },
           [](Handshake& h) { h.n_parts = 0; },
           [](Handshake& h) { h.epoch = 0; }}) {
    Handshake b = a;
    bad(b);
    len = encode_handshake(FrameKind::hello, b, buf.data());
    EXPECT_EQ(decode_handshake(buf.data(), len, FrameKind::hello).status().code(), StatusCode::corrupt_data)
        << describe(b);
  }
}

// Version 2: FFN workers announce their TP rank/degree; the attention side its expected degree.
TEST(Protocol, HandshakeCarriesTpRankAndDegree) {
  AlignedBuf buf(256);
  Handshake f = attention_hs();
  f.role = Role::ffn;
  f.index = 0;
  f.expert_end = 8;
  f.tp_rank = 1;
  f.tp_degree = 2;
  size_t len = encode_handshake(FrameKind::hello_ack, f, buf.data());
  EXPECT_EQ(len, kFrameHeaderBytes + kHandshakeBytes);
  auto d = decode_handshake(buf.data(), len, FrameKind::hello_ack);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->tp_rank, 1);
  EXPECT_EQ(d->tp_degree, 2);
  Handshake a = attention_hs();
  a.tp_degree = 0;  // any
  EXPECT_TRUE(check_handshake_match(a, f).is_ok());
  a.tp_degree = 2;
  EXPECT_TRUE(check_handshake_match(a, f).is_ok());
  a.tp_degree = 1;
  EXPECT_NE(check_handshake_match(a, f).message().find("TP degree"), std::string::npos);
  // A rank outside its degree is a corrupt handshake, not an assert.
  f.tp_rank = 2;
  len = encode_handshake(FrameKind::hello_ack, f, buf.data());
  auto bad = decode_handshake(buf.data(), len, FrameKind::hello_ack);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::corrupt_data);
}

TEST(Protocol, RefuseFrameCarriesReason) {
  AlignedBuf buf(8192);
  size_t len = encode_reason(FrameKind::refuse, 0, 0, 0, "model fingerprint mismatch", buf.data());
  auto r = decode_reason(buf.data(), len);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "model fingerprint mismatch");
  auto h = decode_handshake(buf.data(), len, FrameKind::hello_ack);
  EXPECT_EQ(h.status().code(), StatusCode::unavailable);
  EXPECT_NE(h.status().message().find("refused"), std::string::npos);
}

// Random mutations of valid frames: flips, truncations, extensions, and headers re-sealed
// with random fields (so they pass the checksum and reach the deeper checks). Decoding
// must never crash or read out of bounds (run under ASan in the sanitizer job).
TEST(Protocol, FuzzMutatedFramesNeverCrash) {
  std::mt19937 rng(12345);
  const A2fLimits lim{128, 2, 8, 16};
  int ok_count = 0, err_count = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    AlignedBuf buf(1 << 16);
    uint32_t n = rng() % 17;
    size_t len = build_a2f(buf, n, 128, 2, rng() % 2 ? ScaleGranularity::per_token : ScaleGranularity::per_block, 8,
                           rng, rng() % 2);
    // Work on an exact-size heap copy so ASan sees any overread.
    int mode = static_cast<int>(rng() % 5);
    size_t mlen = len;
    if (mode == 1) mlen = rng() % (len + 1);                  // truncate
    if (mode == 2) mlen = len + 8 * (1 + rng() % 4);          // extend
    std::vector<uint64_t> copy((mlen + 7) / 8 + 1);
    auto* m = reinterpret_cast<uint8_t*>(copy.data());
    std::memcpy(m, buf.data(), std::min(len, mlen));
    if (mode == 0 || mode == 3) {
      int flips = 1 + static_cast<int>(rng() % 8);
      for (int f = 0; f < flips && mlen > 0; ++f) m[rng() % mlen] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    if (mode == 3 || mode == 4) {
      // Random header fields, re-sealed: exercises the size/limit checks behind the checksum.
      FrameHeader h;
      h.kind = static_cast<FrameKind>(1 + rng() % 8);
      h.granularity = static_cast<ScaleGranularity>(rng() % 3);
      h.n_tokens = rng() % 3 == 0 ? static_cast<uint32_t>(rng()) : rng() % 20;
      h.hidden = rng() % 3 == 0 ? static_cast<uint32_t>(rng()) : 128;
      h.top_k = rng() % 3 == 0 ? static_cast<uint32_t>(rng()) : 2;
      h.payload_bytes = rng() % 2 ? mlen - std::min(mlen, kFrameHeaderBytes) : rng();
      if (mlen >= kFrameHeaderBytes) encode_header(h, nullptr, m);
    }
    auto v = decode_a2f(m, mlen, lim);
    auto h2 = decode_handshake(m, mlen, FrameKind::hello);
    auto f = decode_f2a(m, mlen, 128, n);
    auto r = decode_reason(m, mlen);
    auto pg = decode_probe(m, mlen, FrameKind::pong);
    (void)pg;
    (void)h2;
    (void)f;
    (void)r;
    if (v.ok()) {
      ++ok_count;
      // A frame that decodes must be internally consistent.
      EXPECT_LE(v->header.n_tokens, lim.max_tokens);
      for (uint32_t i = 0; i < v->header.n_tokens * v->header.top_k; ++i) {
        ASSERT_GE(v->ids[i], 0);
        ASSERT_LT(v->ids[i], 8);
      }
    } else {
      ++err_count;
      EXPECT_NE(v.status().message(), "");
    }
  }
  EXPECT_GT(err_count, 10000);
  EXPECT_GT(ok_count, 0);  // mode 0 flips in q bytes leave valid frames
}

}  // namespace
}  // namespace afd::comm
