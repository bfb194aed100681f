// runtime/afd/ffn_routing.h: the coverage check and routing masks, which tokens and reply rows
// each FFN worker gets, and the a2f frame encode_a2f writes (read back with comm::decode_a2f).
// Pure functions: no transport.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/protocol.h"
#include "kernels/cpu/ops.h"
#include "runtime/afd/ffn_routing.h"

namespace afd::test_ffn_routing {
namespace {

constexpr int64_t kExperts = 8;

ShardClaim claim(int slot, int64_t b, int64_t e, bool shared, int rank = 0, int degree = 1) {
  return ShardClaim{slot, ExpertRange{b, e, shared, rank, degree}};
}

TEST(FfnRouting, MasksOfExpertParallelShards) {
  FfnRouting rt;
  const std::vector<ShardClaim> c{claim(0, 0, 4, true), claim(1, 4, 8, false)};
  ASSERT_TRUE(build_routing_masks(c, kExperts, &rt).is_ok());
  ASSERT_EQ(rt.expert_workers.size(), 8u);
  EXPECT_EQ(rt.expert_workers[0], 1u);
  EXPECT_EQ(rt.expert_workers[3], 1u);
  EXPECT_EQ(rt.expert_workers[4], 2u);
  EXPECT_EQ(rt.expert_workers[7], 2u);
  EXPECT_EQ(rt.shared_workers, 1u);
}

TEST(FfnRouting, MasksOfTensorParallelSlices) {
  FfnRouting rt;
  // Slots 2 and 5: ranks 0 and 1 of every expert and of the shared part.
  const std::vector<ShardClaim> c{claim(2, 0, 8, true, 0, 2), claim(5, 0, 8, true, 1, 2)};
  ASSERT_TRUE(build_routing_masks(c, kExperts, &rt).is_ok());
  for (uint64_t m : rt.expert_workers) EXPECT_EQ(m, (1u << 2) | (1u << 5));
  EXPECT_EQ(rt.shared_workers, (1u << 2) | (1u << 5));
}

TEST(FfnRouting, CoverageMustBeExactlyOnce) {
  FfnRouting rt;
  auto why = [&](std::vector<ShardClaim> c) {
    Status s = build_routing_masks(c, kExperts, &rt);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    return s.message();
  };
  EXPECT_EQ(why({claim(0, 0, 4, true), claim(1, 5, 8, false)}), "no FFN worker holds expert 4");
  EXPECT_EQ(why({claim(0, 0, 5, true), claim(1, 4, 8, false)}), "expert 4 is held by FFN workers 0 and 1");
  EXPECT_EQ(why({claim(0, 0, 4, false), claim(1, 4, 8, false)}), "no FFN worker holds the shared expert / dense layers");
  EXPECT_EQ(why({claim(0, 0, 8, true, 0, 2)}), "no FFN worker holds intermediate slice 1/2 of expert 0");
  EXPECT_NE(why({claim(0, 0, 8, true, 0, 2), claim(1, 0, 8, true, 0, 1)}).find("overlapping intermediate slices"),
            std::string::npos);
}

TEST(FfnRouting, PartsOfExperts) {
  EXPECT_EQ(parts_of_experts(8, 3), (std::vector<int16_t>{0, 0, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(parts_of_experts(4, 1), (std::vector<int16_t>{0, 0, 0, 0}));
}

// Two workers over two parts: slot 0 experts [0,4) + shared, slot 1 [4,8).
FfnRouting two_parts(bool has_shared) {
  FfnRouting rt;
  const std::vector<ShardClaim> c{claim(0, 0, 4, true), claim(1, 4, 8, false)};
  EXPECT_TRUE(build_routing_masks(c, kExperts, &rt).is_ok());
  rt.has_shared = has_shared;
  rt.part_of_expert = parts_of_experts(kExperts, 2);
  return rt;
}

TEST(FfnRouting, TokensGoToTheHoldersOfTheirExperts) {
  const FfnRouting rt = two_parts(false);
  // Top-2: token 0 -> experts 1, 2 (slot 0); token 1 -> 5, 6 (slot 1); token 2 -> 3, 7 (both).
  const std::vector<int32_t> ids{1, 2, 5, 6, 3, 7};
  std::vector<uint64_t> workers, parts;
  ASSERT_TRUE(route_tokens(rt, TokenRoutes{3, true, 2, kExperts, ids}, true, &workers, &parts).is_ok());
  EXPECT_EQ(workers, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(parts, (std::vector<uint64_t>{1, 2, 3}));
  std::vector<int32_t> rows;
  rows_of_slot(workers, 0, &rows);
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 2}));
  rows_of_slot(workers, 1, &rows);
  EXPECT_EQ(rows, (std::vector<int32_t>{1, 2}));
  // Not by parts: no expert parts are marked.
  ASSERT_TRUE(route_tokens(rt, TokenRoutes{3, true, 2, kExperts, ids}, false, &workers, &parts).is_ok());
  EXPECT_EQ(parts, (std::vector<uint64_t>{0, 0, 0}));
}

TEST(FfnRouting, SharedAndDenseTokensGoToTheSharedHolders) {
  std::vector<uint64_t> workers, parts;
  const std::vector<int32_t> ids{5, 6};
  // A shared expert: every token also goes to slot 0 (part 0).
  ASSERT_TRUE(route_tokens(two_parts(true), TokenRoutes{1, true, 2, kExperts, ids}, true, &workers, &parts).is_ok());
  EXPECT_EQ(workers, (std::vector<uint64_t>{3}));
  EXPECT_EQ(parts, (std::vector<uint64_t>{3}));
  // A dense layer: only the shared/dense holders, whatever the ids say.
  ASSERT_TRUE(route_tokens(two_parts(false), TokenRoutes{2, false, 0, kExperts, {}}, true, &workers, &parts).is_ok());
  EXPECT_EQ(workers, (std::vector<uint64_t>{1, 1}));
}

TEST(FfnRouting, AnExpertIdOutOfRangeIsRefused) {
  std::vector<uint64_t> workers, parts;
  const std::vector<int32_t> ids{1, 8};
  Status s = route_tokens(two_parts(false), TokenRoutes{1, true, 2, kExperts, ids}, true, &workers, &parts);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), "ffn client: expert id 8 out of range");
}

TEST(FfnRouting, ReplyRowsArePartByPart) {
  // Tokens 0..3; parts touched: 0 -> {0}, 1 -> {0,1}, 2 -> {1}, 3 -> {0,1}.
  const std::vector<uint64_t> parts{1, 3, 2, 3};
  const std::vector<int32_t> rows{0, 1, 2, 3};
  std::vector<int32_t> reply;
  reply_rows_of_slot(rows, parts, true, 0, 2, &reply);
  EXPECT_EQ(reply, (std::vector<int32_t>{0, 1, 3, 1, 2, 3}));
  reply_rows_of_slot(rows, parts, true, 1, 2, &reply);  // one part: one row per token
  EXPECT_EQ(reply, rows);
  reply_rows_of_slot(rows, parts, false, 0, 2, &reply);  // epoch 0
  EXPECT_EQ(reply, rows);
}

TEST(FfnRouting, EncodeA2fWritesTheChosenRows) {
  constexpr int64_t H = 256, K = 2, n = 3;
  std::vector<float> h(static_cast<size_t>(n * H));
  for (size_t i = 0; i < h.size(); ++i) h[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i / H));
  const std::vector<int32_t> ids{0, 1, 2, 3, 4, 5};
  const std::vector<float> w{0.5f, 0.5f, 0.25f, 0.75f, 0.1f, 0.9f};
  const std::vector<int32_t> rows{2, 0};
  for (auto g : {comm::ScaleGranularity::per_token, comm::ScaleGranularity::per_block}) {
    const A2fFrame f{.layer = 4, .microbatch = 1, .step = 9, .epoch = 3, .hidden = H, .top_k = K, .granularity = g,
                     .payload_checksum = true};
    auto lay = comm::a2f_layout(2, H, K, g);
    ASSERT_TRUE(lay.ok());
    alignas(8) std::vector<uint64_t> buf((comm::kFrameHeaderBytes + lay->total) / 8 + 1);
    auto* out = reinterpret_cast<uint8_t*>(buf.data());
    auto bytes = encode_a2f(f, rows, h.data(), ids.data(), w.data(), out);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    EXPECT_EQ(*bytes, comm::kFrameHeaderBytes + lay->total);
    auto v = comm::decode_a2f(out, *bytes, comm::A2fLimits{H, K, 8, 16});
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->header.kind, comm::FrameKind::a2f);
    EXPECT_EQ(v->header.layer, 4u);
    EXPECT_EQ(v->header.microbatch, 1u);
    EXPECT_EQ(v->header.step, 9u);
    EXPECT_EQ(v->header.epoch, 3u);
    EXPECT_EQ(v->header.n_tokens, 2u);
    EXPECT_EQ(v->header.granularity, g);
    EXPECT_EQ(v->group, g == comm::ScaleGranularity::per_block ? comm::kScaleBlock : H);
    // Row r is token rows[r]: its ids, weights, and activations within FP8 e4m3 precision.
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t i = rows[static_cast<size_t>(r)];
      for (int64_t k = 0; k < K; ++k) {
        EXPECT_EQ(v->ids[r * K + k], ids[static_cast<size_t>(i * K + k)]);
        EXPECT_EQ(v->weights[r * K + k], w[static_cast<size_t>(i * K + k)]);
      }
      std::vector<float> back(static_cast<size_t>(H));
      const int64_t per_tok = H / v->group;
      kernels::dequantize_fp8_e4m3(v->q + r * H, v->scales + r * per_tok, H, v->group, back.data());
      for (int64_t c = 0; c < H; ++c) {
        const float x = h[static_cast<size_t>(i * H + c)];
        EXPECT_NEAR(back[static_cast<size_t>(c)], x, 0.07f * std::fabs(x) + 1e-3f) << "row " << r << " channel " << c;
      }
    }
  }
}

}  // namespace
}  // namespace afd::test_ffn_routing
