// Reproduces the Step-3 paper's Tables 2, 3, 5, 6, Observation 1 and the §5.1
// arithmetic intensities from the presets, each within 5% of the printed value.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "plan/accelerator.h"
#include "plan/cost_model.h"
#include "plan/model_presets.h"

namespace afd::plan::test_cost_model {
namespace {

constexpr double kTol = 0.05;

::testing::AssertionResult within(double got, double want, double tol = kTol) {
  const double rel = std::fabs(got - want) / std::fabs(want);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", paper " << want << " (rel. error " << rel * 100 << "%)";
}

struct TableRow {
  const char* model;
  double kv_bytes, attn_flops, linear_flops, ffn_flops;
};

// Step-3 paper, Table 2: per decoding token at 8K context.
const TableRow kTable2[] = {
    {"deepseek-v3", 2.88e8, 1.47e11, 2.28e10, 4.84e10},    {"kimi-k2", 2.88e8, 7.37e10, 1.23e10, 4.84e10},
    {"qwen3-235b-a22b", 7.89e8, 2.52e10, 1.34e10, 2.84e10}, {"qwen3-32b", 1.07e9, 1.72e10, 1.21e10, 5.03e10},
    {"llama4-maverick", 1.01e9, 8.05e9, 6.04e9, 2.42e10},   {"minimax-m1", 9.23e8, 3.42e9, 3.75e10, 5.44e10},
    {"ernie-4.5-300b-a47b", 9.06e8, 1.45e10, 1.63e10, 7.61e10}, {"pangu-pro-moe", 8.05e8, 8.05e9, 6.04e9, 2.38e10},
    {"step3", 2.56e8, 3.27e10, 2.07e10, 5.33e10},
};
// Step-3 paper, Table 3: per decoding token at 32K context.
const TableRow kTable3[] = {
    {"deepseek-v3", 1.15e9, 5.89e11, 2.28e10, 4.84e10},    {"kimi-k2", 1.15e9, 2.95e11, 1.23e10, 4.84e10},
    {"qwen3-235b-a22b", 3.15e9, 1.01e11, 1.34e10, 2.84e10}, {"qwen3-32b", 4.29e9, 6.87e10, 1.21e10, 5.03e10},
    {"llama4-maverick", 2.21e9, 1.41e10, 6.04e9, 2.42e10},  {"minimax-m1", 1.93e9, 1.15e10, 3.75e10, 5.44e10},
    {"ernie-4.5-300b-a47b", 3.62e9, 5.80e10, 1.63e10, 7.61e10}, {"pangu-pro-moe", 3.22e9, 3.22e10, 6.04e9, 2.38e10},
    {"step3", 1.02e9, 1.31e11, 2.07e10, 5.33e10},
};

void check_table(const TableRow* rows, size_t n, int64_t ctx) {
  for (size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(rows[i].model);
    auto m = find_model_preset(rows[i].model);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const TokenCost t = decode_token_cost(*m, ctx);
    EXPECT_TRUE(within(t.kv_bytes, rows[i].kv_bytes)) << "KV bytes";
    EXPECT_TRUE(within(t.attn_flops, rows[i].attn_flops)) << "attention FLOPs";
    EXPECT_TRUE(within(t.linear_flops, rows[i].linear_flops)) << "linear FLOPs";
    EXPECT_TRUE(within(t.ffn_flops, rows[i].ffn_flops)) << "FFN FLOPs";
  }
}

TEST(CostModel, Table2At8K) { check_table(kTable2, std::size(kTable2), 8192); }
TEST(CostModel, Table3At32K) { check_table(kTable3, std::size(kTable3), 32768); }

TEST(CostModel, EveryPresetIsInTheTables) {
  EXPECT_EQ(model_presets().size(), std::size(kTable2));
}

// Step-3 paper, Table 4 roofline column and Table 5 unit costs.
TEST(CostModel, Table4RooflineAndTable5UnitCosts) {
  struct Row { const char* acc; double roofline, per_flop, per_byte; };
  const Row rows[] = {{"h800", 591, 2.80e-19, 1.66e-16},
                      {"h20", 74, 7.51e-19, 5.56e-17},
                      {"a800", 156, 6.68e-19, 1.04e-16},
                      {"910b", 175, 6.65e-19, 1.16e-16}};
  for (const auto& r : rows) {
    SCOPED_TRACE(r.acc);
    auto a = find_accelerator(r.acc);
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(within(a->roofline(), r.roofline));
    auto u = unit_cost(*a);
    ASSERT_TRUE(u.ok());
    EXPECT_TRUE(within(u->usd_per_flop, r.per_flop));
    EXPECT_TRUE(within(u->usd_per_byte, r.per_byte));
  }
}

// Step-3 paper, Table 6: USD per 1M tokens; attention at 8K, attention at 32K, FFN; columns
// H800, H20, A800, 910B.
struct CostTableRow {
  const char* model;
  double a8[4], a32[4], ffn[4];
};
const CostTableRow kTable6[] = {
    {"deepseek-v3", {0.054, 0.128, 0.114, 0.113}, {0.197, 0.460, 0.409, 0.407}, {0.014, 0.036, 0.032, 0.032}},
    {"kimi-k2", {0.051, 0.065, 0.057, 0.057}, {0.194, 0.231, 0.205, 0.204}, {0.014, 0.036, 0.032, 0.032}},
    {"qwen3-235b-a22b", {0.135, 0.054, 0.091, 0.101}, {0.527, 0.185, 0.338, 0.376}, {0.008, 0.021, 0.019, 0.019}},
    {"qwen3-32b", {0.181, 0.069, 0.120, 0.133}, {0.716, 0.248, 0.455, 0.508}, {0.014, 0.038, 0.034, 0.033}},
    {"llama4-maverick", {0.169, 0.060, 0.109, 0.121}, {0.369, 0.128, 0.235, 0.262}, {0.007, 0.018, 0.016, 0.016}},
    {"minimax-m1", {0.164, 0.079, 0.121, 0.132}, {0.330, 0.135, 0.226, 0.249}, {0.015, 0.041, 0.036, 0.036}},
    {"ernie-4.5-300b-a47b", {0.155, 0.063, 0.105, 0.116}, {0.606, 0.214, 0.388, 0.432}, {0.021, 0.057, 0.051, 0.051}},
    {"pangu-pro-moe", {0.135, 0.049, 0.088, 0.098}, {0.536, 0.183, 0.340, 0.379}, {0.007, 0.018, 0.016, 0.016}},
    {"step3", {0.048, 0.040, 0.040, 0.043}, {0.176, 0.114, 0.120, 0.133}, {0.015, 0.040, 0.036, 0.035}},
};

std::vector<Accelerator> table4() {
  auto v = resolve_accelerators({"h800", "h20", "a800", "910b"});
  EXPECT_TRUE(v.ok());
  return *v;
}

TEST(CostModel, Table6CostPer1MTokens) {
  const auto accs = table4();
  for (const auto& row : kTable6) {
    SCOPED_TRACE(row.model);
    auto m = find_model_preset(row.model);
    ASSERT_TRUE(m.ok());
    const CostRow c8 = cost_row(*m, 8192, accs), c32 = cost_row(*m, 32768, accs);
    for (int k = 0; k < 4; ++k) {
      SCOPED_TRACE(accs[k].id);
      EXPECT_TRUE(within(*c8.attn_usd_per_m[k], row.a8[k])) << "attention 8K";
      EXPECT_TRUE(within(*c32.attn_usd_per_m[k], row.a32[k])) << "attention 32K";
      EXPECT_TRUE(within(*c8.ffn_usd_per_m[k], row.ffn[k])) << "FFN";
      EXPECT_DOUBLE_EQ(*c8.ffn_usd_per_m[k], *c32.ffn_usd_per_m[k]);  // FFN independent of context
    }
  }
}

// Step-3 paper, Observation 1: best deployments per 1M tokens.
TEST(CostModel, Observation1Deployments) {
  const auto accs = table4();
  auto get = [&](const char* id, int64_t ctx) { return cost_row(*find_model_preset(id), ctx, accs); };
  // 8K: Step-3 0.055 with AFD (attention H20 or A800 - they tie at 0.040 -, FFN H800).
  const CostRow s8 = get("step3", 8192);
  EXPECT_TRUE(within(*s8.afd_usd_per_m, 0.055));
  EXPECT_EQ(s8.afd_ffn, "h800");
  // DSv3 0.068 "with EP and H800": the cheapest single-accelerator deployment.
  const CostRow d8 = get("deepseek-v3", 8192);
  EXPECT_TRUE(within(*d8.single_usd_per_m, 0.068));
  EXPECT_EQ(d8.single, "h800");
  // Qwen3 MoE 0.062 with AFD, H20 attention + H800 FFN.
  const CostRow q8 = get("qwen3-235b-a22b", 8192);
  EXPECT_TRUE(within(*q8.afd_usd_per_m, 0.062));
  EXPECT_EQ(q8.afd_attn, "h20");
  EXPECT_EQ(q8.afd_ffn, "h800");
  // 32K: Step-3 0.129, DSv3 0.211, Qwen3 MoE 0.193.
  EXPECT_TRUE(within(*get("step3", 32768).afd_usd_per_m, 0.129));
  EXPECT_TRUE(within(*get("deepseek-v3", 32768).single_usd_per_m, 0.211));
  EXPECT_TRUE(within(*get("qwen3-235b-a22b", 32768).afd_usd_per_m, 0.193));
  // Step-3 is the cheapest model at both lengths (with AFD).
  for (int64_t ctx : {8192, 32768}) {
    const double step3 = *get("step3", ctx).afd_usd_per_m;
    for (const auto& m : model_presets()) {
      if (m.id == "step3") continue;
      EXPECT_LT(step3, *cost_row(m, ctx, accs).afd_usd_per_m) << m.id << " at " << ctx;
    }
  }
}

// Step-3 paper, §5.1: arithmetic intensity (FLOPs per KV byte, 8-bit KV) of MFA 128, MLA 512,
// Qwen3 MoE GQA 32; independent of context length.
TEST(CostModel, Section51ArithmeticIntensity) {
  const std::map<std::string, double> want = {{"step3", 128}, {"deepseek-v3", 512}, {"qwen3-235b-a22b", 32}};
  for (const auto& [id, ai] : want) {
    auto m = find_model_preset(id);
    ASSERT_TRUE(m.ok());
    EXPECT_TRUE(within(decode_token_cost(*m, 8192).attn_intensity(), ai)) << id;
    EXPECT_TRUE(within(decode_token_cost(*m, 32768).attn_intensity(), ai)) << id;
  }
}

TEST(CostModel, UnpricedAcceleratorHasNoCost) {
  auto a = find_accelerator("h100");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(unit_cost(*a).ok());
  const CostRow r = cost_row(*find_model_preset("step3"), 8192, {*a});
  EXPECT_FALSE(r.attn_usd_per_m[0].has_value());
  EXPECT_FALSE(r.afd_usd_per_m.has_value());
}

}  // namespace
}  // namespace afd::plan::test_cost_model
