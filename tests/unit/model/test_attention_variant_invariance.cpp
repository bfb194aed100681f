// Batch invariance of the attention variants (AttentionOptions::batch_invariant): one
// sequence's attention output for each prompt position is bit-identical whether the prompt is
// attended as one run, as chunks of any size (a prefix-cache hit is a chunk that starts
// later, a full hit a 1-token run), token by token, or beside other sequences' runs and decode
// tokens in the same batch, with pools of 1, 2 and 3 threads, KV caches in f32, bf16 and fp8
// e4m3, on every ISA level — for GQA (Qwen3-MoE shape, with and without a sliding window), MFA
// (Step-3: one K/V head, low-rank query) and MLA (DeepSeek-V3 layout).
//
// The projections in front of the attention proper are linear() products, whose rows are
// checked for independence of n elsewhere (tests/unit/kernels). Here their inputs and weights
// are chosen so that every product is exact in f32 (small multiples of 1/8, or one nonzero
// power of two per weight row after a norm), so the attention arithmetic alone decides the
// bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/isa.h"
#include "kv/paged_kv_cache.h"
#include "model/attention_variant.h"
#include "model/token_batch.h"

#include "attention_test_util.h"

namespace afd {
namespace {

struct Built {
  std::shared_ptr<ModelWeights> w;
  std::vector<std::vector<float>> f32;
};

Matrix f32_matrix(Built& b, int64_t rows, int64_t cols, std::vector<float> x) {
  b.f32.push_back(std::move(x));
  Matrix m;
  m.dtype = DType::f32;
  m.data = b.f32.back().data();
  m.rows = rows;
  m.cols = cols;
  return m;
}

// rows x cols with entries in {-1, 0, 1} / 8: products with small integer inputs are exact.
Matrix exact_matrix(Built& b, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-1, 1);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = static_cast<float>(d(rng)) * 0.125f;
  return f32_matrix(b, rows, cols, std::move(x));
}

// Row r of a selection matrix: one entry +-1 (at a column that varies with r), zeros
// elsewhere, so y = W x selects x's values, exact whatever the summation order.
void selection_row(float* row, int64_t r, int64_t cols) {
  std::fill(row, row + cols, 0.0f);
  row[(r * 7 + r / cols) % cols] = r % 3 == 0 ? -1.0f : 1.0f;
}

Matrix selection_matrix(Built& b, int64_t rows, int64_t cols) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) selection_row(&x[r * cols], r, cols);
  return f32_matrix(b, rows, cols, std::move(x));
}

enum class Family { gqa, gqa_window, mfa, mla };

const char* family_name(Family f) {
  switch (f) {
    case Family::gqa: return "gqa";
    case Family::gqa_window: return "gqa_window";
    case Family::mfa: return "mfa";
    case Family::mla: return "mla";
  }
  return "?";
}

// heads: the query head count (0: the family's small default, below kMqaStackRows; 40 puts MFA
// and MLA on the (token, group of heads) tasks of head_group_tasks).
Built build(Family f, int64_t heads = 0) {
  Built b;
  b.f32.reserve(32);
  b.w = std::make_shared<ModelWeights>();
  ModelConfig& c = b.w->config;
  c.n_layers = 1;
  c.hidden_size = 32;
  c.rope_theta = 10000;
  c.rms_norm_eps = 1e-6;
  b.w->layers.resize(1);
  AttentionWeights& A = b.w->layers[0].attn;
  if (f == Family::mla) {
    c.attention = AttentionKind::mla;
    c.n_heads = c.n_kv_heads = heads > 0 ? heads : 5;
    c.q_lora_rank = 0;
    c.kv_lora_rank = 64;  // the bf16 dot-product kernel's value width (a multiple of 32)
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 12;
    c.rope_interleave = true;
    const int64_t P = c.qk_nope_head_dim, V = c.v_head_dim, L = c.kv_lora_rank;
    A.q = exact_matrix(b, c.n_heads * (P + c.qk_rope_head_dim), c.hidden_size, 1);
    A.kv_a = exact_matrix(b, L + c.qk_rope_head_dim, c.hidden_size, 2);
    A.kv_a_norm = test::random_norm(b.f32, L, 3);
    // kv_b: per head P rows of W_UK (random: q_lat is the variant's own product), then V rows
    // of W_UV (a selection: its product is linear()'s).
    std::mt19937 rng(4);
    std::normal_distribution<float> d(0.0f, 0.3f);
    std::vector<float> kv_b(static_cast<size_t>(c.n_heads * (P + V) * L));
    for (auto& v : kv_b) v = d(rng);
    for (int64_t h = 0; h < c.n_heads; ++h)
      for (int64_t v = 0; v < V; ++v) selection_row(&kv_b[(h * (P + V) + P + v) * L], h * V + v, L);
    A.kv_b = f32_matrix(b, c.n_heads * (P + V), L, std::move(kv_b));
    return b;
  }
  c.attention = AttentionKind::gqa;
  c.head_dim = 64;
  if (f == Family::mfa) {
    c.n_heads = heads > 0 ? heads : 6;
    c.n_kv_heads = 1;
    c.q_lora_rank = 16;
    A.q_a = exact_matrix(b, c.q_lora_rank, c.hidden_size, 5);
    A.q_a_norm = test::random_norm(b.f32, c.q_lora_rank, 6);
    A.q = selection_matrix(b, c.q_dim(), c.q_lora_rank);
  } else {
    c.n_heads = 8;
    c.n_kv_heads = 2;
    c.qk_norm = true;
    c.sliding_window = f == Family::gqa_window ? 21 : 0;
    A.q = exact_matrix(b, c.q_dim(), c.hidden_size, 7);
    A.q_norm = test::random_norm(b.f32, c.head_dim, 8);
    A.k_norm = test::random_norm(b.f32, c.head_dim, 9);
  }
  A.k = exact_matrix(b, c.kv_dim(), c.hidden_size, 10);
  A.v = exact_matrix(b, c.kv_dim(), c.hidden_size, 11);
  return b;
}

// Hidden rows of small integers (exact in bf16 and in the products above).
std::vector<float> hidden_rows(int64_t n, int64_t hidden, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-2, 2);
  std::vector<float> x(static_cast<size_t>(n * hidden));
  for (auto& v : x) v = static_cast<float>(d(rng));
  return x;
}

// One token of a schedule step: sequence, position, and its hidden row.
struct Tok {
  int64_t seq, pos;
  const float* hn;
};

constexpr int64_t kTarget = 0;  // the sequence whose outputs are compared
constexpr int64_t kLen = 45;    // its prompt: crosses 16-position tiles and pages

// A schedule: steps (batches) in order, each a list of tokens. Other sequences' tokens share
// the batches; the target's positions come in ascending order.
using Schedule = std::vector<std::vector<Tok>>;

// The target's prompt in chunks of the given sizes (summing to kLen); extra tokens of other
// sequences (`other`: 0 none, 1 another prompt's run before and a decode token after each
// chunk) share each step.
Schedule chunked(const std::vector<int64_t>& sizes, const std::vector<float>& hn_t, const std::vector<float>& hn_o,
                 int64_t hidden, int other) {
  Schedule s;
  int64_t p = 0, op = 0, dp = 0;
  for (int64_t n : sizes) {
    std::vector<Tok> step;
    if (other != 0) {
      const int64_t run = 3 + (p % 5);
      for (int64_t i = 0; i < run; ++i, ++op) step.push_back({1, op, &hn_o[(op % 40) * hidden]});
    }
    for (int64_t i = 0; i < n; ++i, ++p) step.push_back({kTarget, p, &hn_t[p * hidden]});
    if (other != 0) step.push_back({2, dp, &hn_o[(dp * 3 % 40) * hidden]}), ++dp;
    s.push_back(std::move(step));
  }
  EXPECT_EQ(p, kLen);
  return s;
}

// Runs the schedule on a fresh cache; returns the target's outputs [kLen, o_in_dim].
std::vector<float> run(const Built& built, const Schedule& s, DType kv_dtype, int threads, bool invariant) {
  const ModelConfig& c = built.w->config;
  auto kv = test::make_attention_kv(c, /*block_size=*/16, /*n_blocks=*/64, kv_dtype);
  for (int64_t seq : {0, 1, 2}) EXPECT_TRUE(kv->add_sequence(seq).is_ok());
  ThreadPool pool(threads);
  AttentionOptions opt;
  opt.prec = kernels::ActPrecision::bf16;
  opt.batch_invariant = invariant;
  auto att = make_attention_variant(built.w, kv.get(), opt, &pool);
  const int64_t od = c.o_in_dim();
  std::vector<float> got(static_cast<size_t>(kLen * od), NAN);
  for (const auto& step : s) {
    TokenBatch b;
    b.resize(c, static_cast<int64_t>(step.size()));
    for (size_t i = 0; i < step.size(); ++i) {
      b.seq[i] = step[i].seq;
      b.pos[i] = step[i].pos;
      std::copy_n(step[i].hn, c.hidden_size, &b.hn[i * c.hidden_size]);
      EXPECT_TRUE(kv->append(step[i].seq, 1).is_ok());
    }
    std::vector<float> out(static_cast<size_t>(b.n * od), NAN);
    att->attend(0, b, out.data());
    for (size_t i = 0; i < step.size(); ++i)
      if (step[i].seq == kTarget) std::memcpy(&got[step[i].pos * od], &out[i * od], static_cast<size_t>(od) * 4);
  }
  return got;
}

void check(Family f, int64_t heads = 0) {
  const Built built = build(f, heads);
  const ModelConfig& c = built.w->config;
  const auto hn_t = hidden_rows(kLen, c.hidden_size, 21), hn_o = hidden_rows(40, c.hidden_size, 22);
  std::vector<std::pair<std::string, Schedule>> schedules;
  const std::vector<std::vector<int64_t>> splits = {
      {kLen},          {44, 1},           {1, 44},
      {7, 30, 8},      {16, 16, 13},      {17, 17, 11},
      {9, 9, 9, 9, 9}, {8, 37},           {5, 40},
      {3, 3, 3, 36},   {32, 1, 1, 1, 10}, {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1}};
  for (const auto& sp : splits) {
    std::string name;
    for (int64_t n : sp) name += std::to_string(n) + " ";
    schedules.push_back({"chunks " + name, chunked(sp, hn_t, hn_o, c.hidden_size, 0)});
    schedules.push_back({"chunks " + name + "among others", chunked(sp, hn_t, hn_o, c.hidden_size, 1)});
  }
  schedules.push_back(
      {"token by token among others", chunked(std::vector<int64_t>(kLen, 1), hn_t, hn_o, c.hidden_size, 1)});
  const int64_t od = c.o_in_dim();
  for (int i = 0; i <= static_cast<int>(kernels::detected_isa()); ++i) {
    const auto isa = static_cast<kernels::Isa>(i);
    kernels::set_isa_limit(isa);
    for (DType dt : {DType::f32, DType::bf16, DType::f8_e4m3}) {
      const std::vector<float> want = run(built, schedules[0].second, dt, 1, true);
      for (size_t k = 0; k < want.size(); ++k)  // every output written (run() starts them as NaN)
        ASSERT_TRUE(std::isfinite(want[k])) << family_name(f) << " output " << k << " not written";
      for (const auto& [name, s] : schedules) {
        for (int threads : {1, 2, 3}) {
          const std::vector<float> got = run(built, s, dt, threads, true);
          for (int64_t p = 0; p < kLen; ++p)
            ASSERT_EQ(std::memcmp(&got[p * od], &want[p * od], static_cast<size_t>(od) * 4), 0)
                << family_name(f) << " position " << p << " differs from one whole run: " << name << ", "
                << dtype_name(dt) << " cache, " << threads << " threads, " << kernels::isa_name(isa);
        }
      }
    }
  }
  kernels::set_isa_limit(kernels::Isa::avx512);
}

TEST(AttentionVariantInvariance, GqaPositionsDoNotDependOnTheirRun) { check(Family::gqa); }
TEST(AttentionVariantInvariance, GqaSlidingWindowPositionsDoNotDependOnTheirRun) { check(Family::gqa_window); }
TEST(AttentionVariantInvariance, MfaPositionsDoNotDependOnTheirRun) { check(Family::mfa); }
TEST(AttentionVariantInvariance, MlaPositionsDoNotDependOnTheirRun) { check(Family::mla); }
TEST(AttentionVariantInvariance, MfaWithManyHeadsPositionsDoNotDependOnTheirRun) { check(Family::mfa, 40); }
TEST(AttentionVariantInvariance, MlaWithManyHeadsPositionsDoNotDependOnTheirRun) { check(Family::mla, 40); }

}  // namespace
}  // namespace afd
