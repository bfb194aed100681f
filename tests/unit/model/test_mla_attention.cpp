// The MLA attention variant on hand-built random weights: a prefill chunk (expanded form,
// MODELS.md B3) and the same tokens decoded one at a time (absorbed form, B4) give the same
// outputs (f32 KV cache, rtol 1e-5), with a low-rank or a direct query, a bf16 or FP8 kv_b
// (FP8 heads straddling 128-row blocks), and decode tokens mixed with a prefill run of
// another sequence in one batch. The cache rows are the normalized latent and the rotated
// rope key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/linear_fp8.h"
#include "kv/paged_kv_cache.h"
#include "model/attention_variant.h"
#include "model/token_batch.h"

#include "attention_test_util.h"

namespace afd {
namespace {

struct Dims {
  int64_t hidden = 48, heads = 5, q_lora = 24, lkv = 32, nope = 16, rope = 8, v = 12;
  bool fp8_kv_b = false;
  int64_t tokens = 11;  // prefill chunk length
  int64_t key_block = 0;  // AttentionOptions::mla_key_block
};

struct Built {
  std::shared_ptr<ModelWeights> w;
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint8_t>> bytes;
};

Matrix random_matrix(Built& b, int64_t rows, int64_t cols, uint32_t seed, bool fp8 = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = d(rng);
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  if (!fp8) {
    m.dtype = DType::f32;
    b.f32.push_back(std::move(x));
    m.data = b.f32.back().data();
    return m;
  }
  const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  b.bytes.emplace_back(static_cast<size_t>(rows * cols));
  b.f32.emplace_back(static_cast<size_t>(sr * sc));
  kernels::quantize_fp8_blocks(x.data(), rows, cols, b.bytes.back().data(), b.f32.back().data());
  m.dtype = DType::f8_e4m3;
  m.data = b.bytes.back().data();
  m.scale = b.f32.back().data();
  m.scale_stride = sc;
  return m;
}

Built build(const Dims& d) {
  Built b;
  b.f32.reserve(64);
  b.bytes.reserve(8);
  b.w = std::make_shared<ModelWeights>();
  ModelConfig& c = b.w->config;
  c.attention = AttentionKind::mla;
  c.n_layers = 1;
  c.hidden_size = d.hidden;
  c.n_heads = c.n_kv_heads = d.heads;
  c.q_lora_rank = d.q_lora;
  c.kv_lora_rank = d.lkv;
  c.qk_nope_head_dim = d.nope;
  c.qk_rope_head_dim = d.rope;
  c.v_head_dim = d.v;
  c.rope_interleave = true;
  c.rope_theta = 10000;
  c.rms_norm_eps = 1e-6;
  c.rope_scaling.type = RopeScaling::Type::yarn;
  c.rope_scaling.factor = 40;
  c.rope_scaling.original_max_position_embeddings = 16;  // short, so the test's positions reach the ramp
  c.rope_scaling.mscale = 0.707;
  c.rope_scaling.mscale_all_dim = 1.0;
  b.w->layers.resize(1);
  AttentionWeights& A = b.w->layers[0].attn;
  const int64_t qd = d.heads * (d.nope + d.rope);
  if (d.q_lora > 0) {
    A.q_a = random_matrix(b, d.q_lora, d.hidden, 1);
    A.q_a_norm = test::random_norm(b.f32, d.q_lora, 2);
    A.q = random_matrix(b, qd, d.q_lora, 3);
  } else {
    A.q = random_matrix(b, qd, d.hidden, 3);
  }
  A.kv_a = random_matrix(b, d.lkv + d.rope, d.hidden, 4);
  A.kv_a_norm = test::random_norm(b.f32, d.lkv, 5);
  A.kv_b = random_matrix(b, d.heads * (d.nope + d.v), d.lkv, 6, d.fp8_kv_b);
  return b;
}

std::unique_ptr<PagedKvCache> make_kv(const ModelConfig& c) {
  const KvLayout l = kv_layout(c);
  EXPECT_EQ(l.n_kv_heads, 1);
  EXPECT_EQ(l.k_dim, c.kv_lora_rank + c.qk_rope_head_dim);
  EXPECT_EQ(l.v_dim, 0);
  return test::make_attention_kv(c, /*block_size=*/4, /*n_blocks=*/128, DType::f32);
}

std::vector<float> hidden_rows(int64_t n, int64_t hidden, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * hidden));
  for (auto& v : x) v = d(rng);
  return x;
}

// Runs tokens (seq, pos, hn row) as one batch; returns out [n, o_in_dim].
std::vector<float> run(AttentionVariant& att, PagedKvCache& kv, const ModelConfig& c,
                       const std::vector<std::pair<int64_t, int64_t>>& toks, const std::vector<float>& hn_rows,
                       const std::vector<int64_t>& row_of) {
  TokenBatch b;
  b.resize(c, static_cast<int64_t>(toks.size()));
  for (size_t i = 0; i < toks.size(); ++i) {
    b.seq[i] = toks[i].first;
    b.pos[i] = toks[i].second;
    std::copy_n(&hn_rows[row_of[i] * c.hidden_size], c.hidden_size, &b.hn[i * c.hidden_size]);
    EXPECT_TRUE(kv.append(toks[i].first, 1).is_ok());
  }
  std::vector<float> out(static_cast<size_t>(b.n * c.o_in_dim()), NAN);
  att.attend(0, b, out.data());
  return out;
}

void check_forms_agree(const Dims& d) {
  Built built = build(d);
  const ModelConfig& c = built.w->config;
  auto kv = make_kv(c);
  ThreadPool pool(2);
  AttentionOptions opt;
  opt.mla_key_block = d.key_block;
  auto att = make_attention_variant(built.w, kv.get(), opt, &pool);
  ASSERT_TRUE(att);
  const int64_t m = d.tokens, od = c.o_in_dim();
  auto hn = hidden_rows(m + 1, c.hidden_size, 9);
  ASSERT_TRUE(kv->add_sequence(0).is_ok());
  ASSERT_TRUE(kv->add_sequence(1).is_ok());
  ASSERT_TRUE(kv->add_sequence(2).is_ok());
  // Sequence 0: one prefill chunk of m tokens (expanded form).
  std::vector<std::pair<int64_t, int64_t>> toks;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < m; ++i) {
    toks.push_back({0, i});
    rows.push_back(i);
  }
  auto expanded = run(*att, *kv, c, toks, hn, rows);
  // Sequence 1: the same tokens one at a time (absorbed form); the last one shares its batch
  // with a 3-token prefill run of sequence 2.
  std::vector<float> absorbed(static_cast<size_t>(m * od));
  for (int64_t i = 0; i + 1 < m; ++i) {
    auto o = run(*att, *kv, c, {{1, i}}, hn, {i});
    std::copy(o.begin(), o.end(), &absorbed[i * od]);
  }
  auto mixed = run(*att, *kv, c, {{2, 0}, {2, 1}, {1, m - 1}, {2, 2}}, hn, {m, 0, m - 1, 1});
  std::copy_n(&mixed[2 * od], od, &absorbed[(m - 1) * od]);
  // Both sequences cached the same rows (normalized latent, rotated rope key).
  std::vector<float> r0(static_cast<size_t>(c.kv_lora_rank + c.qk_rope_head_dim)), r1 = r0;
  for (int64_t i = 0; i < m; ++i) {
    kv->read_k(0, 0, i, r0.data());
    kv->read_k(0, 1, i, r1.data());
    for (size_t k = 0; k < r0.size(); ++k) ASSERT_NEAR(r0[k], r1[k], 1e-5f * (1 + std::fabs(r0[k]))) << i;
  }
  float mx = 0;
  for (float v : expanded) mx = std::max(mx, std::fabs(v));
  ASSERT_GT(mx, 0.0f);
  for (int64_t i = 0; i < m * od; ++i)
    ASSERT_NEAR(absorbed[i], expanded[i], 1e-5f * mx) << "token " << i / od << " value " << i % od;
  // The prefill run of sequence 2 in the mixed batch: tokens hn[m], hn[0], hn[1].
  ASSERT_TRUE(std::isfinite(mixed[3 * od]));
}

TEST(MlaAttention, ExpandedPrefillAndAbsorbedDecodeAgree) { check_forms_agree(Dims{}); }

TEST(MlaAttention, DirectQueryProjection) {
  Dims d;
  d.q_lora = 0;
  check_forms_agree(d);
}

TEST(MlaAttention, Fp8KvB) {
  Dims d;
  d.fp8_kv_b = true;  // 5 heads x 28 rows = 140 rows: head 4 straddles the 128-row block edge
  check_forms_agree(d);
}

TEST(MlaAttention, LongPrefillChunk) {
  Dims d;
  d.tokens = 150;  // more than one 128-token block of the expanded form's products
  check_forms_agree(d);
}

TEST(MlaAttention, KeyBlocksOfTheExpandedForm) {
  // Cached positions expanded 16 and 7 at a time: the online softmax crosses block edges, and
  // query rows whose positions end before a block skip it.
  for (int64_t kb : {16, 7}) {
    Dims d;
    d.tokens = 150;
    d.key_block = kb;
    check_forms_agree(d);
  }
}

TEST(MlaAttention, BatchedDecodeMatchesOneAtATime) {
  // Four sequences decode one token each in one batch (q_lat as one product per head) and,
  // as copies with the same rows, one at a time (row-by-row q_lat).
  Dims d;
  Built built = build(d);
  const ModelConfig& c = built.w->config;
  auto kv = make_kv(c);
  ThreadPool pool(2);
  auto att = make_attention_variant(built.w, kv.get(), AttentionOptions{}, &pool);
  ASSERT_TRUE(att);
  const int64_t od = c.o_in_dim(), pre = 5;
  auto hn = hidden_rows(4 * (pre + 1), c.hidden_size, 10);
  for (int64_t s = 0; s < 8; ++s) {
    ASSERT_TRUE(kv->add_sequence(s).is_ok());
    std::vector<std::pair<int64_t, int64_t>> toks;
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < pre; ++i) {
      toks.push_back({s, i});
      rows.push_back(s % 4 * (pre + 1) + i);
    }
    run(*att, *kv, c, toks, hn, rows);
  }
  std::vector<std::pair<int64_t, int64_t>> toks;
  std::vector<int64_t> rows;
  for (int64_t s = 0; s < 4; ++s) {
    toks.push_back({s, pre});
    rows.push_back(s * (pre + 1) + pre);
  }
  auto batched = run(*att, *kv, c, toks, hn, rows);
  float mx = 0;
  for (float v : batched) mx = std::max(mx, std::fabs(v));
  ASSERT_GT(mx, 0.0f);
  for (int64_t s = 0; s < 4; ++s) {
    auto one = run(*att, *kv, c, {{s + 4, pre}}, hn, {s * (pre + 1) + pre});
    for (int64_t k = 0; k < od; ++k)
      ASSERT_NEAR(one[k], batched[s * od + k], 1e-5f * mx) << "sequence " << s << " value " << k;
  }
}

TEST(MlaAttention, ManyHeads) {
  Dims d;
  d.heads = 40;  // more than one 32-head tile of the decode kernel
  check_forms_agree(d);
}

}  // namespace
}  // namespace afd
