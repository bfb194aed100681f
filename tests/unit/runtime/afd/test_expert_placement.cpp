// Expert placement (runtime/afd/expert_placement.h): the routing of (token, expert) pairs to
// replicas, the reply rows in expert order, the sum in part order (pure); the plan; and end to
// end, that an in-process bundle's logits do not change by a bit when the experts move every
// forward pass (replicas included), whatever the FFN and attention worker counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../../model/model_test_util.h"
#include "core/dtype.h"
#include "model/tools/make_model.h"
#include "model/weights.h"
#include "runtime/afd/expert_placement.h"
#include "runtime/engine_factory.h"

namespace afd {
namespace {

ModelConfig moe_config(int64_t layers, int64_t experts, int64_t top_k) {
  ModelConfig c;
  c.n_layers = layers;
  c.n_experts = experts;
  c.n_experts_per_tok = top_k;
  c.moe_intermediate_size = 8;
  c.hidden_size = 4;
  return c;
}

TEST(ExpertPlacement, ContiguousIsTheRangesOfTheSlots) {
  const ModelConfig c = moe_config(2, 8, 2);
  const std::vector<int> slots{3, 5};
  const ExpertPlacement p = contiguous_expert_placement(c, slots);
  ASSERT_EQ(p.replicas.size(), 2u);
  for (int e = 0; e < 8; ++e) EXPECT_EQ(p.replicas[1][e], (std::vector<int>{e < 4 ? 3 : 5})) << e;
}

// Three slots; expert 1 has two replicas (slots 0 and 2): its pairs alternate between them.
// Slot 2 holds the shared part: every token, one shared row each after its expert rows.
TEST(ExpertPlacement, PairsGoToOneReplicaEachInTurn) {
  ExpertPlacement p;
  p.n_experts = 4;
  p.replicas = {{{0}, {0, 2}, {1}, {2}}};
  const std::vector<int32_t> ids = {1, 2,   // token 0
                                    1, 3,   // token 1
                                    0, 1,   // token 2
                                    2, 3};  // token 3
  TokenRoutes in;
  in.n = 4;
  in.moe = true;
  in.top_k = 2;
  in.n_experts = 4;
  in.topk_ids = ids;
  std::vector<PlacedSlot> out;
  const std::vector<int> slots{0, 1, 2};
  std::vector<int64_t> turn;
  ASSERT_TRUE(route_placed(p, 0, in, slots, /*shared_slot=*/2, /*shared_rows=*/true, &turn, &out).is_ok());
  EXPECT_EQ(turn, (std::vector<int64_t>{1, 3, 2, 2}));
  ASSERT_EQ(out.size(), 3u);
  // Expert 1's pairs, in token order: token 0 -> slot 0, token 1 -> slot 2, token 2 -> slot 0.
  EXPECT_EQ(out[0].rows, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(out[0].ids, (std::vector<int32_t>{1, -1, -1, -1, 0, 1, -1, -1}));
  EXPECT_EQ(out[0].reply_parts, (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(out[0].reply_rows, (std::vector<int32_t>{2, 0, 2}));
  EXPECT_EQ(out[1].rows, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(out[1].reply_parts, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(out[2].rows, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(out[2].ids, (std::vector<int32_t>{-1, -1, 1, 3, -1, -1, -1, 3}));
  EXPECT_EQ(out[2].reply_rows, (std::vector<int32_t>{1, 1, 3, 0, 1, 2, 3}));
  EXPECT_EQ(out[2].reply_parts, (std::vector<int32_t>{1, 3, 3, 4, 4, 4, 4}));
  // The turns go on in the next call: expert 1's next pair goes to slot 2 (its 4th: 3 % 2 = 1).
  {
    const std::vector<int32_t> one = {1, 0};
    TokenRoutes in1{.n = 1, .moe = true, .top_k = 2, .n_experts = 4, .topk_ids = one};
    std::vector<PlacedSlot> o1;
    ASSERT_TRUE(route_placed(p, 0, in1, slots, 2, false, &turn, &o1).is_ok());
    EXPECT_EQ(o1[2].ids, (std::vector<int32_t>{1, -1}));
    EXPECT_EQ(o1[0].ids, (std::vector<int32_t>{-1, 0}));
  }
  // Every pair exactly once over the slots.
  for (size_t q = 0; q < ids.size(); ++q) {
    int n = 0;
    for (const PlacedSlot& s : out) n += s.ids[q] == ids[q];
    EXPECT_EQ(n, 1) << q;
  }

  // The sum: per token in part order, whatever slot a row came from.
  const int64_t H = 2;
  std::vector<std::vector<uint16_t>> replies(3);
  auto bits = [](float v) { return f32_to_bf16(v).bits; };
  for (size_t i = 0; i < 3; ++i)
    for (size_t r = 0; r < out[i].reply_rows.size(); ++r) {
      // Row value: a large value for part 0 so that the order of the additions matters in f32.
      const float v = out[i].reply_parts[r] == 0 ? 1.0e8f : 1.0f + 0.25f * static_cast<float>(out[i].reply_parts[r]);
      replies[i].push_back(bits(v));
      replies[i].push_back(bits(-v));
    }
  const std::vector<const uint16_t*> ptrs{replies[0].data(), replies[1].data(), replies[2].data()};
  std::vector<float> sum(static_cast<size_t>(4 * H), -1.0f);
  sum_placed_replies(out, ptrs, 4, H, sum.data());
  for (int64_t t = 0; t < 4; ++t) {
    std::vector<std::pair<int32_t, float>> rows;
    for (size_t i = 0; i < 3; ++i)
      for (size_t r = 0; r < out[i].reply_rows.size(); ++r)
        if (out[i].reply_rows[r] == t) rows.emplace_back(out[i].reply_parts[r], bf16_to_f32(replies[i][2 * r]));
    std::sort(rows.begin(), rows.end());
    float want = 0;
    for (auto [part, v] : rows) want += v;
    EXPECT_EQ(sum[static_cast<size_t>(t * H)], want) << t;
    EXPECT_EQ(sum[static_cast<size_t>(t * H + 1)], -want) << t;
  }
}

// The rows of one token come from three slots in the order parts 5, 7, 0: added in part order
// (2^24 + 1) + 1 = 2^24 in f32, where the slots' order would give (1 + 1) + 2^24 = 2^24 + 2.
TEST(ExpertPlacement, SumIsInPartOrderNotSlotOrder) {
  std::vector<PlacedSlot> slots(3);
  slots[0].reply_rows = {0};
  slots[0].reply_parts = {5};
  slots[1].reply_rows = {0};
  slots[1].reply_parts = {7};
  slots[2].reply_rows = {0};
  slots[2].reply_parts = {0};
  const uint16_t one = f32_to_bf16(1.0f).bits, big = f32_to_bf16(16777216.0f).bits;
  const std::vector<const uint16_t*> rows{&one, &one, &big};
  float out = 0;
  sum_placed_replies(slots, rows, 1, 1, &out);
  EXPECT_EQ(out, 16777216.0f);
}

TEST(ExpertPlacement, BadRoutesAreErrors) {
  ExpertPlacement p;
  p.n_experts = 4;
  p.replicas = {{{0}, {}, {1}, {7}}};
  std::vector<int32_t> ids = {0, 5};
  TokenRoutes in{.n = 1, .moe = true, .top_k = 2, .n_experts = 4, .topk_ids = ids};
  std::vector<PlacedSlot> out;
  std::vector<int64_t> turn;
  const std::vector<int> slots{0, 1};
  EXPECT_NE(route_placed(p, 0, in, slots, -1, false, &turn, &out).message().find("outside [0, 4)"), std::string::npos);
  ids = {0, 1};
  EXPECT_NE(route_placed(p, 0, in, slots, -1, false, &turn, &out).message().find("has no replica"), std::string::npos);
  ids = {0, 3};
  EXPECT_NE(route_placed(p, 0, in, slots, -1, false, &turn, &out).message().find("not in the assignment"),
            std::string::npos);
}

TEST(ExpertPlacement, PlanBalancesASkewedLayerWithReplicas) {
  const ModelConfig c = moe_config(1, 8, 2);
  ExpertLoadCounter counts(c);
  std::vector<int32_t> ids;
  // 80 % of the tokens on experts 0 and 1 (the first slot's contiguous range), 20 % on 4 and 5.
  for (int t = 0; t < 1000; ++t) ids.insert(ids.end(), {t % 5 != 0 ? 0 : 4, t % 5 != 0 ? 1 : 5});
  counts.add(0, ids);
  const std::vector<int> slots{2, 4};
  auto plan = plan_expert_placement(c, counts, slots, 1);  // R = 1 rounded up to 2 (8 + R over 2 slots)
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->redundant, 2);
  EXPECT_NEAR(plan->contiguous_mean, 1.6, 1e-9);
  EXPECT_LT(plan->planned_mean, 1.1);
  int replicas = 0;
  for (const auto& r : plan->placement.replicas[0]) {
    EXPECT_FALSE(r.empty());
    for (int s : r) EXPECT_TRUE(s == 2 || s == 4) << s;
    replicas += static_cast<int>(r.size());
  }
  EXPECT_EQ(replicas, 10);
  // More replicas than the slots can hold without doubling an expert on one: as many as they
  // can (every expert on both); on one slot none.
  auto all = plan_expert_placement(c, counts, slots, 99);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->redundant, 8);
  for (const auto& r : all->placement.replicas[0]) EXPECT_EQ(r, (std::vector<int>{2, 4}));
  const std::vector<int> one{3};
  auto single = plan_expert_placement(c, counts, one, 4);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->redundant, 0);
  EXPECT_FALSE(plan_expert_placement(c, counts, std::vector<int>{}, 0).ok());
  counts.decay(0.5);
  EXPECT_DOUBLE_EQ(counts.total(), 1000.0);
}

// Greedy decode of three prompts in one batch; every step's logits appended.
std::vector<float> decode_logits(Engine& e, int steps) {
  const int64_t V = e.config().vocab_size;
  std::vector<std::vector<int32_t>> next = {{1, 5, 9, 13, 2}, {1, 7, 3}, {4, 4, 8, 15, 16, 23, 42}};
  std::vector<int64_t> seqs;
  for (size_t i = 0; i < next.size(); ++i) seqs.push_back(*e.create_sequence());
  std::vector<float> all;
  for (int s = 0; s < steps; ++s) {
    std::vector<BatchItem> items;
    for (size_t i = 0; i < seqs.size(); ++i) items.push_back(BatchItem{seqs[i], next[i], false});
    std::vector<float> logits;
    Status st = e.forward(items, &logits);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) return all;
    all.insert(all.end(), logits.begin(), logits.end());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const float* row = logits.data() + static_cast<int64_t>(i) * V;
      next[i] = {static_cast<int32_t>(std::max_element(row, row + V) - row)};
    }
  }
  return all;
}

// A tiny checkpoint of `arch` with `top_k` routed experts per token (more terms per token's
// sum: their order shows in f32), written once per process.
std::string tiny_model(Arch arch, int64_t top_k) {
  auto c = make_preset_config(arch, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (top_k > 0) c->n_experts_per_tok = top_k;
  MakeModelOptions o;
  o.out_dir = test::process_scratch_dir(std::string("afd_placement_") + arch_name(arch));
  o.seed = 5;
  auto r = make_model(*c, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return o.out_dir;
}

std::vector<float> run(const std::string& model, const char* topology, double interval_s, int64_t redundant) {
  auto w = load_model(model);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  if (!w.ok()) return {};
  EngineOptions o;
  o.model_dir = model;
  o.precision = Precision::fast;
  o.deterministic = true;
  o.kv.capacity_tokens = 512;
  o.kv.max_seqs = 8;
  o.n_threads = 1;
  o.topology = *parse_topology(topology);
  o.afd.eplb = true;
  o.afd.eplb_interval_s = interval_s;
  o.afd.eplb_redundant = redundant;
  auto e = make_engine(o, *w);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? decode_logits(**e, 10) : std::vector<float>{};
}

// Placement-independent to the bit: contiguous 1A2F against 1A3F and 2A3F whose experts move at
// every forward pass (interval 1 ns), with replicas; Qwen3-MoE with 6 of 8 experts per token,
// and DeepSeek-V3 (4 of 16, a shared expert, a dense first layer). This checks the plumbing end
// to end (every pair computed once, by some worker, its row back to its token); a few BF16
// rows of similar size add exactly in f32 in any order, so the order of the sum is what
// SumIsInPartOrderNotSlotOrder checks.
TEST(ExpertPlacement, LogitsDoNotDependOnWhereExpertsRun) {
  for (const std::string& model : {tiny_model(Arch::qwen3_moe, 6), tiny_model(Arch::deepseek_v3, 0)}) {
    SCOPED_TRACE(model);
    const std::vector<float> base = run(model, "1A2F", 0, 0);
    ASSERT_FALSE(base.empty());
    for (auto [topology, redundant] : {std::pair{"1A3F", int64_t{1}}, std::pair{"2A3F", int64_t{4}}}) {
      const std::vector<float> moved = run(model, topology, 1e-9, redundant);
      ASSERT_EQ(moved.size(), base.size()) << topology;
      EXPECT_EQ(std::memcmp(moved.data(), base.data(), base.size() * sizeof(float)), 0) << topology;
    }
  }
}

}  // namespace
}  // namespace afd
