// FfnClient + FfnWorker over real transports: AFD results equal the local FFN on the
// same FP8-rounded input (bit-exact for one FFN worker; sum of BF16 partials for EP),
// aggregation across attention workers, handshake refusal, and the fault paths.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "comm/fault_transport.h"
#include "comm/inproc_transport.h"
#include "comm/ucx_transport.h"
#include "core/timer.h"
#include "../../model/model_test_util.h"
#include "../../model/tiny_model.h"
#include "ffn_cluster.h"
#include "model/fingerprint.h"
#include "model/tools/make_model.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "runtime/ffn_backend.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/afd/ffn_worker.h"

namespace afd {
namespace {

using namespace comm;

using test::deadline_in_ms;
using test::random_batch;
using test::wait_until;

// qwen2_moe tiny (8 experts, top-2, shared expert) with layer 1 dense.
std::shared_ptr<const ModelWeights> tiny_model(const std::string& tag, int64_t n_layers = 3, uint64_t seed = 3) {
  static std::map<std::string, std::shared_ptr<const ModelWeights>> cache;
  if (cache.count(tag)) return cache[tag];
  // One directory per process (ctest runs the cases of this binary as parallel processes).
  cache[tag] = test::make_tiny_moe("afd_test_ffn_afd_" + tag, n_layers, seed, {1});
  return cache[tag];
}

// The monolithic reference: FP8 round trip of h, full ffn_part.
std::vector<float> reference(const ModelWeights& w, int64_t layer, const TokenBatch& b) {
  std::vector<float> h(b.h.begin(), b.h.begin() + b.n * w.config.hidden_size);
  std::vector<uint8_t> q8;
  std::vector<float> sc;
  fp8_round_trip(h.data(), b.n, w.config.hidden_size, 0, &q8, &sc);
  std::vector<float> out(h.size());
  FfnPartOptions opt;
  FfnScratch scratch;
  bool moe = w.config.is_moe_layer(layer);
  ffn_part(w, layer, h.data(), b.n, moe ? b.topk_ids.data() : nullptr, moe ? b.topk_w.data() : nullptr, out.data(),
           opt, &scratch, nullptr);
  return out;
}

// The EP reference: the same FP8 input, each FFN worker's partial (its experts; the shared
// expert and dense layers on worker 0) rounded to BF16, summed in f32.
std::vector<float> reference_ep(const ModelWeights& w, int64_t layer, const TokenBatch& b, int y) {
  const ModelConfig& c = w.config;
  std::vector<float> h(b.h.begin(), b.h.begin() + b.n * c.hidden_size);
  std::vector<uint8_t> q8;
  std::vector<float> sc;
  fp8_round_trip(h.data(), b.n, c.hidden_size, 0, &q8, &sc);
  std::vector<float> out(h.size(), 0.0f), part(h.size());
  bool moe = c.is_moe_layer(layer);
  for (int j = 0; j < y; ++j) {
    FfnPartOptions opt;
    opt.include_shared = j == 0;
    opt.experts_mask.assign(static_cast<size_t>(c.n_experts), 0);
    for (int64_t e = j * c.n_experts / y; e < (j + 1) * c.n_experts / y; ++e) opt.experts_mask[e] = 1;
    FfnScratch scratch;
    ffn_part(w, layer, h.data(), b.n, moe ? b.topk_ids.data() : nullptr, moe ? b.topk_w.data() : nullptr, part.data(),
             opt, &scratch, nullptr);
    for (size_t i = 0; i < out.size(); ++i) out[i] += round_bf16(part[i]);
  }
  return out;
}

struct Bundle {
  std::shared_ptr<InprocHub> hub = std::make_shared<InprocHub>();
  std::vector<std::unique_ptr<Transport>> ffn_t, attn_t;
  std::vector<std::unique_ptr<FfnWorker>> workers;
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  ThreadPool pool{1};
  int gather_window_us = FfnWorkerOptions{}.gather_window_us;  // for the workers start_workers makes
  ~Bundle() {
    stop = true;
    for (auto& t : threads) t.join();
  }
};

std::unique_ptr<Transport> inproc(Bundle& b, const std::string& name) {
  auto t = InprocTransport::create(b.hub, name);
  EXPECT_TRUE(t.ok());
  return std::move(t).value();
}

// x attention transports and y FFN workers running on threads (inproc).
// tp: FFN TP degree; ranges[j] (when given) overrides worker j's expert range.
void start_workers(Bundle& b, std::shared_ptr<const ModelWeights> w, int x, int y, bool fault_wrap = false, int tp = 1,
                   std::vector<std::pair<int64_t, int64_t>> ranges = {}) {
  for (int j = 0; j < y; ++j) {
    std::unique_ptr<Transport> t = inproc(b, "ffn" + std::to_string(j));
    if (fault_wrap) t = std::make_unique<FaultTransport>(std::move(t), 11);
    ASSERT_TRUE(t->listen("ffn" + std::to_string(j) + "-addr").is_ok());
    FfnWorkerOptions o;
    o.index = j;
    o.n_ffn = y;
    o.n_attention = x;
    o.peer_timeout_ms = 500;
    o.gather_window_us = b.gather_window_us;
    o.tp = tp;
    if (!ranges.empty()) o.expert_begin = ranges[j].first, o.expert_end = ranges[j].second;
    auto wk = FfnWorker::create(w, t.get(), o, nullptr);
    ASSERT_TRUE(wk.ok()) << wk.status().to_string();
    b.workers.push_back(std::move(wk).value());
    b.ffn_t.push_back(std::move(t));
  }
  for (int j = 0; j < y; ++j) {
    b.threads.emplace_back([&b, j] { (void)b.workers[j]->run(&b.stop); });
  }
}

FfnClientOptions client_opts(int index, int x, int y, int mbs = 2) {
  FfnClientOptions o;
  o.index = index;
  o.n_attention = x;
  o.ffn_names.clear();
  for (int j = 0; j < y; ++j) {
    o.ffn_names.push_back("ffn" + std::to_string(j));
    o.ffn_addresses.push_back("ffn" + std::to_string(j) + "-addr");
  }
  o.microbatches = mbs;
  o.max_tokens = 32;
  o.timeout_ms = 3000;
  o.connect_timeout_ms = 5000;
  // No liveness pings unless a test asks: they would take faults meant for data frames.
  o.probe_interval_ms = 0;
  return o;
}

// One attention worker ("attn0") and y FFN workers on b's hub; the attention side's client.
Result<std::unique_ptr<FfnClient>> one_attention(Bundle& b, std::shared_ptr<const ModelWeights> w, int y) {
  start_workers(b, w, 1, y);
  b.attn_t.push_back(inproc(b, "attn0"));
  return FfnClient::create(w, b.attn_t[0].get(), client_opts(0, 1, y));
}

// One forward pass (every layer, micro-batch 0, n tokens) through a client with one FFN
// worker: every output equals the local FFN on the same FP8-rounded input, in BF16.
void expect_exact_pass(FfnClient& cl, const ModelWeights& w, int64_t n, uint32_t seed) {
  for (int64_t layer = 0; layer < w.config.n_layers; ++layer) {
    TokenBatch u = random_batch(w.config, n, seed + static_cast<uint32_t>(layer));
    ASSERT_TRUE(cl.dispatch(layer, 0, u).is_ok());
    Status c = cl.combine(layer, 0, u);
    ASSERT_TRUE(c.is_ok()) << c.to_string();
    auto ref = reference(w, layer, u);
    for (int64_t i = 0; i < u.n * w.config.hidden_size; ++i) ASSERT_EQ(u.ffn_out[i], round_bf16(ref[i])) << i;
  }
}

TEST(FfnAfd, OneWorkerIsBitExactToLocalFp8PlusBf16) {
  auto w = tiny_model("a");
  Bundle b;
  auto cl = one_attention(b, w, 1);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  const int64_t H = w->config.hidden_size;
  for (int step = 0; step < 2; ++step) {
    for (int64_t layer = 0; layer < w->config.n_layers; ++layer) {
      TokenBatch mb0 = random_batch(w->config, 7, 100 + step * 10 + layer);
      TokenBatch mb1 = random_batch(w->config, 3, 200 + step * 10 + layer);
      ASSERT_TRUE((*cl)->dispatch(layer, 0, mb0).is_ok());
      ASSERT_TRUE((*cl)->dispatch(layer, 1, mb1).is_ok());
      for (auto [mb, batch] : {std::pair<int, TokenBatch*>{0, &mb0}, {1, &mb1}}) {
        Status s = (*cl)->combine(layer, mb, *batch);
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        auto ref = reference(*w, layer, *batch);
        for (int64_t i = 0; i < batch->n * H; ++i) {
          ASSERT_EQ(batch->ffn_out[i], round_bf16(ref[i])) << "layer " << layer << " mb " << mb << " at " << i;
        }
      }
    }
  }
  EXPECT_GT(b.workers[0]->stats().batches.load(), 0);
}

TEST(FfnAfd, TwoAttentionTwoFfnAggregatesAndMatches) {
  auto w = tiny_model("a");
  Bundle b;
  start_workers(b, w, 2, 2);
  b.attn_t.push_back(inproc(b, "attn0"));
  b.attn_t.push_back(inproc(b, "attn1"));
  std::vector<std::unique_ptr<FfnClient>> cls(2);
  std::vector<std::thread> ts;
  std::atomic<int> failures{0}, ready{0};
  double max_rel = 0;
  std::mutex mu;
  for (int a = 0; a < 2; ++a) {
    ts.emplace_back([&, a] {
      auto cl = FfnClient::create(w, b.attn_t[a].get(), client_opts(a, 2, 2));
      if (!cl.ok()) {
        ADD_FAILURE() << cl.status().to_string();
        failures++;
        ready += 100;  // releases the other client from every step barrier
        return;
      }
      ready++;
      const int64_t H = w->config.hidden_size;
      for (int step = 0; step < 4; ++step) {
        // Start every step together, as the attention workers of one bundle do (a machine
        // busy with other tests could otherwise run one client's steps all before the
        // other's first, and nothing would be aggregated).
        while (ready.load() < 2 * (step + 1)) std::this_thread::yield();
        for (int64_t layer = 0; layer < w->config.n_layers; ++layer) {
          TokenBatch bt[2] = {random_batch(w->config, 5 + a, 1000 * a + step * 10 + layer),
                              random_batch(w->config, 4, 5000 * a + step * 10 + layer)};
          for (int mb = 0; mb < 2; ++mb) {
            if (!(*cl)->dispatch(layer, mb, bt[mb]).is_ok()) failures++;
          }
          for (int mb = 0; mb < 2; ++mb) {
            Status s = (*cl)->combine(layer, mb, bt[mb]);
            if (!s.is_ok()) {
              ADD_FAILURE() << s.to_string();
              failures++;
              continue;
            }
            auto ref = reference_ep(*w, layer, bt[mb], 2);
            double amax = 1e-6;
            for (float v : ref) amax = std::max(amax, static_cast<double>(std::fabs(v)));
            for (int64_t i = 0; i < bt[mb].n * H; ++i) {
              double d = std::fabs(bt[mb].ffn_out[i] - ref[i]) / amax;
              std::lock_guard<std::mutex> lk(mu);
              max_rel = std::max(max_rel, d);
            }
          }
        }
        ready++;
      }
      cls[a] = std::move(cl).value();
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  // Against the locally computed sum of BF16 partials; only the expert GEMMs over the
  // aggregated batch (other row counts) may round differently.
  EXPECT_LT(max_rel, 1e-3);
  // EP: each token went only to the workers holding its experts (shared holder: all).
  EXPECT_GT(b.workers[0]->stats().tokens.load(), b.workers[1]->stats().tokens.load());
  // Both attention workers' frames were aggregated into single batches at least sometimes.
  EXPECT_GT(b.workers[0]->stats().multi_peer_batches.load() + b.workers[1]->stats().multi_peer_batches.load(), 0);
  // What GET /metrics of an FFN worker process reports (serve/metrics/ffn_metrics.h).
  for (auto& wk : b.workers) {
    const FfnWorkerStats& st = wk->stats();
    EXPECT_EQ(st.attention_serving.load(), 2);
    EXPECT_EQ(st.peer_losses.load(), 0);
    EXPECT_GT(st.started_ns.load(), 0);
    int64_t in_buckets = 0;
    for (const auto& c : st.batch_tokens) in_buckets += c.load();
    EXPECT_EQ(in_buckets, st.batches.load());
    EXPECT_GT(st.batches.load(), 0);
  }
}

// At layer 0 an FFN worker waits up to gather_window_us for the attention workers that
// were active on that micro-batch in the last step, so their frames aggregate. An
// attention worker with an empty micro-batch, or one that went idle, must not hold the
// others' batches for that window step after step: with fewer sequences than
// micro-batches x workers, a 2A1F bundle's steps must not wait a window per micro-batch.
TEST(FfnAfd, EmptyOrIdleAttentionWorkerDelaysOthersAtMostOneWindow) {
  auto w = tiny_model("a");
  Bundle b;
  b.gather_window_us = 1000000;  // 1 s: a wait for it cannot hide in a step's noise
  start_workers(b, w, 2, 1);
  b.attn_t.push_back(inproc(b, "attn0"));
  b.attn_t.push_back(inproc(b, "attn1"));
  auto c0 = FfnClient::create(w, b.attn_t[0].get(), client_opts(0, 2, 1));
  auto c1 = FfnClient::create(w, b.attn_t[1].get(), client_opts(1, 2, 1));
  ASSERT_TRUE(c0.ok() && c1.ok());
  // One step of `cl` over the micro-batches in `mbs`; its wall time in ms.
  auto step = [&](FfnClient& cl, std::vector<int> mbs, uint32_t seed) {
    int64_t t0 = now_ns();
    for (int64_t layer = 0; layer < w->config.n_layers; ++layer) {
      std::vector<TokenBatch> bt;
      for (int mb : mbs) bt.push_back(random_batch(w->config, 3, seed + 10 * static_cast<uint32_t>(layer) + mb));
      for (size_t i = 0; i < mbs.size(); ++i) EXPECT_TRUE(cl.dispatch(layer, mbs[i], bt[i]).is_ok());
      for (size_t i = 0; i < mbs.size(); ++i) EXPECT_TRUE(cl.combine(layer, mbs[i], bt[i]).is_ok());
    }
    return static_cast<double>(now_ns() - t0) / 1e6;
  };
  // Phase 1: both step together; attention worker 1 has nothing in micro-batch 1.
  std::atomic<int> started{0};
  std::vector<double> ms0;
  std::thread t1([&] {
    for (int s = 0; s < 3; ++s) {
      while (started.load() < 2 * s + 1) std::this_thread::yield();
      started++;
      step(**c1, {0}, 500 + s);
    }
  });
  for (int s = 0; s < 3; ++s) {
    started++;
    while (started.load() < 2 * s + 2) std::this_thread::yield();
    ms0.push_back(step(**c0, {0, 1}, 100 + s));
  }
  t1.join();
  // Phase 2: attention worker 1 goes idle. The first step may wait one window for it.
  for (int s = 0; s < 3; ++s) ms0.push_back(step(**c0, {0, 1}, 200 + s));
  for (int s : {1, 2, 4, 5}) EXPECT_LT(ms0[s], 400.0) << "step " << s << " of attention worker 0";
  EXPECT_EQ(b.workers[0]->stats().late_peers.load(), 0);
}

TEST(FfnAfd, HandshakeMismatchIsRefusedWithAClearError) {
  auto w = tiny_model("a");
  auto other = tiny_model("b", 4);  // different layer count: different fingerprint
  Bundle b;
  start_workers(b, w, 1, 1);
  b.attn_t.push_back(inproc(b, "attn0"));
  auto cl = FfnClient::create(other, b.attn_t[0].get(), client_opts(0, 1, 1));
  ASSERT_FALSE(cl.ok());
  EXPECT_NE(cl.status().message().find("fingerprint"), std::string::npos) << cl.status().to_string();
  // Another x is no mismatch: the worker was started for 1 attention worker, and one that
  // says it is index 1 of 2 joins (attention workers join a running deployment; a duplicate
  // index is refused: test_ffn_admission.cpp).
  b.attn_t.push_back(inproc(b, "attn1"));
  auto c2 = FfnClient::create(w, b.attn_t[1].get(), client_opts(1, 2, 1));
  ASSERT_TRUE(c2.ok()) << c2.status().to_string();
  EXPECT_EQ(b.workers[0]->stats().refused.load(), 1);
}

// Two checkpoints of one architecture with different weights (another seed): the
// fingerprint samples the stored values, so the handshake refuses them too; a second load
// of the same checkpoint is accepted.
TEST(FfnAfd, HandshakeRefusesACheckpointWithOtherWeights) {
  auto w = tiny_model("a");
  auto reseeded = tiny_model("a_seed4", 3, 4);
  EXPECT_NE(model_fingerprint(*w), model_fingerprint(*reseeded));
  auto again = load_model(w->checkpoint->dir());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(model_fingerprint(*w), model_fingerprint(**again));
  Bundle b;
  start_workers(b, w, 1, 1);
  b.attn_t.push_back(inproc(b, "attn0"));
  auto cl = FfnClient::create(reseeded, b.attn_t[0].get(), client_opts(0, 1, 1));
  ASSERT_FALSE(cl.ok());
  EXPECT_NE(cl.status().message().find("fingerprint"), std::string::npos) << cl.status().to_string();
}

// ---- Tensor parallelism (--ffn-tp) --------------------------------------------------

// Summed over the t ranks, the TP-sliced ffn_part equals the unsliced one (f32, ~1e-5):
// MoE layers with the shared expert and the dense layer 1.
TEST(FfnTp, SlicedFfnPartSumsToUnsliced) {
  auto w = tiny_model("a");
  const ModelConfig& c = w->config;
  const int64_t H = c.hidden_size, n = 9;
  TokenBatch b = random_batch(c, n, 77);
  for (int t : {2, 4}) {
    std::vector<std::shared_ptr<const ModelWeights>> slices;
    for (int r = 0; r < t; ++r) {
      auto sl = slice_ffn_tp(w, FfnTpSlice{r, t, 0, -1, true});
      ASSERT_TRUE(sl.ok()) << sl.status().to_string();
      slices.push_back(*sl);
    }
    // Layout: gate is a view into the checkpoint at row r*I/t; down is an owned copy of columns.
    const FfnWeights& e0 = w->layers[0].moe.experts[0];
    const FfnWeights& s1 = slices[1]->layers[0].moe.experts[0];
    EXPECT_EQ(s1.gate.rows, c.moe_intermediate_size / t);
    EXPECT_EQ(s1.gate.data, static_cast<const void*>(e0.gate.row_ptr(c.moe_intermediate_size / t)));
    EXPECT_EQ(s1.down.rows, H);
    EXPECT_EQ(s1.down.cols, c.moe_intermediate_size / t);
    const size_t es = dtype_size(e0.down.dtype);
    EXPECT_EQ(std::memcmp(s1.down.row_ptr(5), e0.down.row_ptr(5) + (c.moe_intermediate_size / t) * es,
                          static_cast<size_t>(s1.down.cols) * es), 0);
    for (int64_t layer = 0; layer < c.n_layers; ++layer) {
      const bool moe = c.is_moe_layer(layer);
      std::vector<float> full(static_cast<size_t>(n * H)), sum(full.size(), 0.0f), part(full.size());
      FfnPartOptions opt;
      FfnScratch scratch;
      ffn_part(*w, layer, b.h.data(), n, moe ? b.topk_ids.data() : nullptr, moe ? b.topk_w.data() : nullptr,
               full.data(), opt, &scratch, nullptr);
      for (int r = 0; r < t; ++r) {
        ffn_part(*slices[r], layer, b.h.data(), n, moe ? b.topk_ids.data() : nullptr,
                 moe ? b.topk_w.data() : nullptr, part.data(), opt, &scratch, nullptr);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
      }
      double amax = 0, dmax = 0;
      for (size_t i = 0; i < full.size(); ++i) {
        amax = std::max(amax, static_cast<double>(std::fabs(full[i])));
        dmax = std::max(dmax, static_cast<double>(std::fabs(full[i] - sum[i])));
      }
      EXPECT_GT(amax, 1e-3) << "layer " << layer;
      EXPECT_LT(dmax, 1e-5 * std::max(1.0, amax)) << "t " << t << " layer " << layer;
    }
  }
  // Held range only: experts outside it and the shared/dense part are not kept.
  auto part = slice_ffn_tp(w, FfnTpSlice{1, 2, 4, 8, false});
  ASSERT_TRUE(part.ok());
  EXPECT_TRUE((*part)->layers[0].moe.experts[3].empty());
  EXPECT_FALSE((*part)->layers[0].moe.experts[4].empty());
  EXPECT_TRUE((*part)->layers[0].moe.shared.empty());
  EXPECT_TRUE((*part)->layers[1].dense.empty());
  // A degree that does not divide the intermediate size names the field.
  auto bad = slice_ffn_tp(w, FfnTpSlice{0, 3, 0, -1, true});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("moe_intermediate_size"), std::string::npos) << bad.status().to_string();
  auto hubp = std::make_shared<InprocHub>();
  auto tr = InprocTransport::create(hubp, "ffn0");
  ASSERT_TRUE(tr.ok());
  FfnWorkerOptions o;
  o.n_ffn = 3;
  o.tp = 3;
  auto wk = FfnWorker::create(w, tr->get(), o, nullptr);
  ASSERT_FALSE(wk.ok());
  EXPECT_NE(wk.status().message().find("moe_intermediate_size"), std::string::npos) << wk.status().to_string();
  o.n_ffn = 4;  // 3 does not divide 4
  EXPECT_FALSE(FfnWorker::create(w, tr->get(), o, nullptr).ok());
}

// Hybrid 1A4F with --ffn-tp 2: workers 0,1 = group 0 (experts [0,4), shared/dense), workers
// 2,3 = group 1 (experts [4,8)). A token goes to both ranks of every group holding one of its
// experts (group 0 always: shared expert / dense layer), and the combine equals the mono
// emulation (LocalFfnBackend combine_shards 4, combine_tp 2) bit for bit.
TEST(FfnTp, HybridRoutesToAllRanksAndMatchesMonoEmulation) {
  auto w = tiny_model("a");
  const ModelConfig& c = w->config;
  const int64_t H = c.hidden_size, K = c.n_experts_per_tok;
  Bundle b;
  start_workers(b, w, 1, 4, false, 2);
  b.attn_t.push_back(inproc(b, "attn0"));
  FfnClientOptions co = client_opts(0, 1, 4);
  co.expect_tp = 2;
  auto cl = FfnClient::create(w, b.attn_t[0].get(), co);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  for (int64_t e = 0; e < c.n_experts; ++e) EXPECT_EQ((*cl)->expert_workers(e), e < 4 ? 0b0011u : 0b1100u) << e;
  EXPECT_EQ((*cl)->shared_workers(), 0b0011u);
  EXPECT_EQ((*cl)->ffn_handshake(3).tp_rank, 1);
  EXPECT_EQ((*cl)->ffn_handshake(3).tp_degree, 2);

  LocalFfnOptions lo;
  lo.fp8_dispatch = true;
  lo.combine_shards = 4;
  lo.combine_tp = 2;
  for (int r = 0; r < 2; ++r) lo.tp_slices.push_back(*slice_ffn_tp(w, FfnTpSlice{r, 2, 0, -1, true}));
  LocalFfnBackend mono(w, lo, nullptr);
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    TokenBatch tb = random_batch(c, 6, 300 + layer);
    // Token 0: experts 0,1 (group 0 only); token 1: experts 5,6 (group 1 + shared group 0).
    tb.topk_ids[0] = 0, tb.topk_ids[1] = 1, tb.topk_ids[K] = 5, tb.topk_ids[K + 1] = 6;
    ASSERT_TRUE((*cl)->dispatch(layer, 0, tb).is_ok());
    if (c.is_moe_layer(layer)) {
      int64_t group1 = 0;
      for (int64_t i = 0; i < tb.n; ++i)
        group1 += tb.topk_ids[i * K] >= 4 || tb.topk_ids[i * K + 1] >= 4 ? 1 : 0;
      EXPECT_EQ((*cl)->last_sent_tokens(0, 0), tb.n);  // shared expert: every token
      EXPECT_EQ((*cl)->last_sent_tokens(0, 1), tb.n);
      EXPECT_EQ((*cl)->last_sent_tokens(0, 2), group1);
      EXPECT_EQ((*cl)->last_sent_tokens(0, 3), group1);
      EXPECT_GE(group1, 1);
      EXPECT_LT(group1, tb.n);
    } else {  // dense: group 0's ranks only
      EXPECT_EQ((*cl)->last_sent_tokens(0, 0), tb.n);
      EXPECT_EQ((*cl)->last_sent_tokens(0, 1), tb.n);
      EXPECT_EQ((*cl)->last_sent_tokens(0, 2), 0);
      EXPECT_EQ((*cl)->last_sent_tokens(0, 3), 0);
    }
    Status s = (*cl)->combine(layer, 0, tb);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    TokenBatch ref = tb;
    ASSERT_TRUE(mono.dispatch(layer, 0, ref).is_ok());
    for (int64_t i = 0; i < tb.n * H; ++i) ASSERT_EQ(tb.ffn_out[i], ref.ffn_out[i]) << "layer " << layer << " at " << i;
  }
}

// Pure TP (1A2F, --ffn-tp 2): both ranks hold a slice of every expert, so every token goes to both.
TEST(FfnTp, PureTpSendsEveryTokenToEveryRank) {
  auto w = tiny_model("a");
  Bundle b;
  start_workers(b, w, 1, 2, false, 2);
  b.attn_t.push_back(inproc(b, "attn0"));
  auto cl = FfnClient::create(w, b.attn_t[0].get(), client_opts(0, 1, 2));  // expect_tp 0: any
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  for (int64_t e = 0; e < w->config.n_experts; ++e) EXPECT_EQ((*cl)->expert_workers(e), 0b11u);
  TokenBatch tb = random_batch(w->config, 5, 9);
  ASSERT_TRUE((*cl)->dispatch(0, 0, tb).is_ok());
  EXPECT_EQ((*cl)->last_sent_tokens(0, 0), 5);
  EXPECT_EQ((*cl)->last_sent_tokens(0, 1), 5);
  ASSERT_TRUE((*cl)->combine(0, 0, tb).is_ok());
}

// The client refuses shard sets that do not cover every (expert, intermediate slice) exactly once.
TEST(FfnTp, HandshakeRefusesOverlappingAndMissingSlices) {
  auto w = tiny_model("a");
  {  // Expert 3's slice 0/2 claimed by workers 0 and 2.
    Bundle b;
    start_workers(b, w, 1, 4, false, 2, {{0, 4}, {0, 4}, {3, 8}, {4, 8}});
    b.attn_t.push_back(inproc(b, "attn0"));
    auto cl = FfnClient::create(w, b.attn_t[0].get(), client_opts(0, 1, 4));
    ASSERT_FALSE(cl.ok());
    EXPECT_NE(cl.status().message().find("expert 3, intermediate slice 0/2, is held by FFN workers 0 and 2"),
              std::string::npos)
        << cl.status().to_string();
  }
  {  // Expert 7's slice 1/2 held by nobody.
    Bundle b;
    start_workers(b, w, 1, 4, false, 2, {{0, 4}, {0, 4}, {4, 8}, {4, 7}});
    b.attn_t.push_back(inproc(b, "attn0"));
    auto cl = FfnClient::create(w, b.attn_t[0].get(), client_opts(0, 1, 4));
    ASSERT_FALSE(cl.ok());
    EXPECT_NE(cl.status().message().find("no FFN worker holds intermediate slice 1/2 of expert 7"), std::string::npos)
        << cl.status().to_string();
  }
  {  // The attention side expects TP degree 4, the workers have 2: refused by the handshake.
    Bundle b;
    start_workers(b, w, 1, 2, false, 2);
    b.attn_t.push_back(inproc(b, "attn0"));
    FfnClientOptions co = client_opts(0, 1, 2);
    co.expect_tp = 4;
    auto cl = FfnClient::create(w, b.attn_t[0].get(), co);
    ASSERT_FALSE(cl.ok());
    EXPECT_NE(cl.status().message().find("TP degree"), std::string::npos) << cl.status().to_string();
  }
}

// 1A1F whose FFN side sends through a FaultTransport (*fault), so a test can stall it.
Result<std::unique_ptr<FfnClient>> faulty_ffn_bundle(Bundle& b, std::shared_ptr<const ModelWeights> w,
                                                     const FfnClientOptions& opts, FaultTransport** fault) {
  start_workers(b, w, 1, 1, /*fault_wrap=*/true);
  b.attn_t.push_back(inproc(b, "attn0"));
  *fault = static_cast<FaultTransport*>(b.ffn_t[0].get());
  return FfnClient::create(w, b.attn_t[0].get(), opts);
}

TEST(FfnAfd, StallTimesOutThenRecovers) {
  auto w = tiny_model("a");
  Bundle b;
  auto opts = client_opts(0, 1, 1);
  opts.timeout_ms = 1000;  // long enough for the recovery passes on a loaded 2-core CI machine
  FaultTransport* fault = nullptr;
  auto cl = faulty_ffn_bundle(b, w, opts, &fault);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  TokenBatch t = random_batch(w->config, 4, 7);
  fault->set_stall(true);
  ASSERT_TRUE((*cl)->dispatch(0, 0, t).is_ok());
  int64_t t0 = now_ns();
  Status s = (*cl)->combine(0, 0, t);
  EXPECT_EQ(s.code(), StatusCode::timeout) << s.to_string();
  EXPECT_NE(s.message().find("ffn0"), std::string::npos) << s.message();
  EXPECT_LT(now_ns() - t0, 5000000000);
  // Connected but not answering: health() says so (the front end then fails requests fast).
  Status h = (*cl)->health();
  EXPECT_EQ(h.code(), StatusCode::unavailable) << h.to_string();
  EXPECT_NE(h.message().find("ffn0"), std::string::npos) << h.to_string();
  EXPECT_NE(h.message().find("no reply within"), std::string::npos) << h.to_string();
  fault->set_stall(false);
  // The next forward pass works; the late reply of the failed one is dropped.
  expect_exact_pass(**cl, *w, 4, 8);
  EXPECT_TRUE((*cl)->health().is_ok()) << (*cl)->health().to_string();  // a success clears it
}

// An idle attention side (no forward passes at all) still learns that its FFN worker went
// silent: the liveness probe's pong is overdue, health() says so, and clears when it answers.
TEST(FfnAfd, ProbeSeesASilentFfnWorkerWithoutTraffic) {
  auto w = tiny_model("a");
  Bundle b;
  auto opts = client_opts(0, 1, 1);
  opts.probe_interval_ms = 50;
  opts.timeout_ms = 400;
  FaultTransport* fault = nullptr;
  auto cl = faulty_ffn_bundle(b, w, opts, &fault);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  ASSERT_TRUE(wait_until([&] { return (*cl)->probes_answered(0) >= 2; }, 5000));
  EXPECT_GE(b.workers[0]->stats().probes.load(), 2);
  EXPECT_TRUE((*cl)->health().is_ok()) << (*cl)->health().to_string();

  fault->set_stall(true);  // the FFN side's sends (its pongs) are held: connected, silent
  const int64_t t0 = now_ns();
  ASSERT_TRUE(wait_until([&] { return !(*cl)->health().is_ok(); }, 5000));
  const int64_t took_ms = (now_ns() - t0) / 1000000;
  EXPECT_GE(took_ms, opts.timeout_ms - 60);  // not before a pong is overdue (one 50 ms interval of slack)
  Status h = (*cl)->health();
  EXPECT_EQ(h.code(), StatusCode::unavailable);
  EXPECT_NE(h.message().find("FFN worker 'ffn0' has not answered a liveness probe"), std::string::npos)
      << h.to_string();

  const int64_t answered = (*cl)->probes_answered(0);
  fault->set_stall(false);
  ASSERT_TRUE(wait_until([&] { return (*cl)->health().is_ok(); }, 5000)) << (*cl)->health().to_string();
  EXPECT_GT((*cl)->probes_answered(0), answered);
  // The data path never saw the probes: a forward pass works and is exact.
  expect_exact_pass(**cl, *w, 4, 40);
}

// After a pass timed out on a stalled FFN worker, health() holds the stall (the front end
// stops placing requests) only until the worker answers again: its first pong after the
// stall ends the hold, long before stall_hold_ms, with no forward pass needed.
TEST(FfnAfd, StallHoldEndsWhenTheWorkerAnswersAProbe) {
  auto w = tiny_model("a");
  Bundle b;
  auto opts = client_opts(0, 1, 1);
  opts.probe_interval_ms = 50;
  opts.timeout_ms = 400;
  opts.stall_hold_ms = 120000;  // far beyond the test: only an answer can end the hold
  FaultTransport* fault = nullptr;
  auto cl = faulty_ffn_bundle(b, w, opts, &fault);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  ASSERT_TRUE(wait_until([&] { return (*cl)->probes_answered(0) >= 1; }, 5000));

  fault->set_stall(true);
  TokenBatch t = random_batch(w->config, 4, 7);
  ASSERT_TRUE((*cl)->dispatch(0, 0, t).is_ok());
  Status s = (*cl)->combine(0, 0, t);
  ASSERT_EQ(s.code(), StatusCode::timeout) << s.to_string();
  Status h = (*cl)->health();
  EXPECT_EQ(h.code(), StatusCode::unavailable) << h.to_string();
  EXPECT_NE(h.message().find("ffn0"), std::string::npos) << h.to_string();

  const int64_t answered = (*cl)->probes_answered(0);
  fault->set_stall(false);
  // The held pong (or the next one) arrives within a few probe intervals; 30 s is only the
  // test's patience on a loaded machine, a quarter of the hold.
  const int64_t t0 = now_ns();
  ASSERT_TRUE(wait_until([&] { return (*cl)->health().is_ok(); }, 30000)) << (*cl)->health().to_string();
  EXPECT_LT(now_ns() - t0, int64_t{opts.stall_hold_ms} * 1000000 / 4);
  EXPECT_GT((*cl)->probes_answered(0), answered);
  expect_exact_pass(**cl, *w, 4, 8);  // the late reply of the failed pass is dropped
}

// Without probes nothing but a pass can show the worker answers again: the hold lasts until
// one succeeds (or stall_hold_ms), and health() says how it ends.
TEST(FfnAfd, WithoutProbesTheStallHoldLastsUntilAPassSucceeds) {
  auto w = tiny_model("a");
  Bundle b;
  auto opts = client_opts(0, 1, 1);  // probes off
  opts.timeout_ms = 400;
  opts.stall_hold_ms = 120000;
  FaultTransport* fault = nullptr;
  auto cl = faulty_ffn_bundle(b, w, opts, &fault);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  fault->set_stall(true);
  TokenBatch t = random_batch(w->config, 4, 7);
  ASSERT_TRUE((*cl)->dispatch(0, 0, t).is_ok());
  ASSERT_EQ((*cl)->combine(0, 0, t).code(), StatusCode::timeout);
  fault->set_stall(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Status h = (*cl)->health();
  EXPECT_EQ(h.code(), StatusCode::unavailable) << h.to_string();
  EXPECT_NE(h.message().find("traffic resumes 120000 ms after it"), std::string::npos) << h.to_string();
  expect_exact_pass(**cl, *w, 4, 8);
  EXPECT_TRUE((*cl)->health().is_ok()) << (*cl)->health().to_string();
}

// Traffic shows liveness: while forward passes succeed, no ping goes out; once they stop,
// pings start within an interval or two.
TEST(FfnAfd, ProbesStayOffTheWireUnderTraffic) {
  auto w = tiny_model("a");
  Bundle b;
  start_workers(b, w, 1, 1);
  b.attn_t.push_back(inproc(b, "attn0"));
  auto opts = client_opts(0, 1, 1);
  opts.probe_interval_ms = 1000;
  auto cl = FfnClient::create(w, b.attn_t[0].get(), opts);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  const int64_t until = deadline_in_ms(1500);
  int passes = 0;
  while (now_ns() < until) {
    for (int64_t layer = 0; layer < w->config.n_layers; ++layer) {
      TokenBatch u = random_batch(w->config, 2, 60 + passes);
      ASSERT_TRUE((*cl)->dispatch(layer, 0, u).is_ok());
      ASSERT_TRUE((*cl)->combine(layer, 0, u).is_ok());
    }
    ++passes;
  }
  EXPECT_GT(passes, 10);
  EXPECT_EQ(b.workers[0]->stats().probes.load(), 0);  // 1.5 s, past the first due ping
  const int64_t dl = deadline_in_ms(5000);
  while ((*cl)->probes_answered(0) == 0 && now_ns() < dl) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE((*cl)->probes_answered(0), 1);
}

// Without probes (--ffn-probe-ms 0) a silent FFN worker is only noticed by a request that
// times out on it.
TEST(FfnAfd, WithoutProbesAnIdleClientCannotSeeAStall) {
  auto w = tiny_model("a");
  Bundle b;
  auto opts = client_opts(0, 1, 1);
  opts.timeout_ms = 200;
  FaultTransport* fault = nullptr;
  auto cl = faulty_ffn_bundle(b, w, opts, &fault);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  fault->set_stall(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE((*cl)->health().is_ok()) << (*cl)->health().to_string();
  EXPECT_EQ((*cl)->probes_answered(0), 0);
  EXPECT_EQ(b.workers[0]->stats().probes.load(), 0);
  fault->set_stall(false);
}

TEST(FfnAfd, MalformedFrameGetsAnErrorReplyAndWorkerKeepsServing) {
  auto w = tiny_model("a");
  Bundle b;
  start_workers(b, w, 1, 1);
  auto ft = std::make_unique<FaultTransport>(inproc(b, "attn0"), 5);
  FaultTransport* fault = ft.get();
  b.attn_t.push_back(std::move(ft));
  auto opts = client_opts(0, 1, 1);
  opts.payload_checksum = true;  // every flipped byte is detected
  auto cl = FfnClient::create(w, b.attn_t[0].get(), opts);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  TokenBatch t = random_batch(w->config, 6, 9);
  fault->corrupt_next_sends(1, 3);
  ASSERT_TRUE((*cl)->dispatch(0, 0, t).is_ok());
  Status s = (*cl)->combine(0, 0, t);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("malformed"), std::string::npos) << s.to_string();
  EXPECT_EQ(b.workers[0]->stats().bad_frames.load(), 1);
  for (int64_t layer = 0; layer < w->config.n_layers; ++layer) {
    TokenBatch u = random_batch(w->config, 4, 20 + layer);
    ASSERT_TRUE((*cl)->dispatch(layer, 0, u).is_ok());
    Status c = (*cl)->combine(layer, 0, u);
    ASSERT_TRUE(c.is_ok()) << c.to_string();
  }
}

// After an FFN worker's connection dropped: dispatches layer 0, micro-batch 0 (a new pass)
// every 30 ms until the client has redialled and re-handshaken, for up to 5 s.
Status dispatch_once_back(FfnClient& cl, TokenBatch& t) {
  Status ok;
  const int64_t dl = deadline_in_ms(5000);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ok = cl.dispatch(0, 0, t);
  } while (!ok.is_ok() && now_ns() < dl);
  return ok;
}

TEST(FfnAfd, LostFfnWorkerIsUnavailableAndTakenBackOnReconnect) {
  auto w = tiny_model("a");
  Bundle b;
  FaultTransport* fault = nullptr;
  auto cl = faulty_ffn_bundle(b, w, client_opts(0, 1, 1), &fault);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  TokenBatch t = random_batch(w->config, 4, 30);
  // The FFN side drops the connection mid-layer: before its reply is out (held by the
  // stall, so the reply cannot arrive first however the threads are scheduled).
  fault->set_stall(true);
  ASSERT_TRUE((*cl)->dispatch(0, 0, t).is_ok());
  ASSERT_TRUE(b.ffn_t[0]->disconnect(*b.ffn_t[0]->peer_id("attn0")).is_ok());
  Status s = (*cl)->combine(0, 0, t);
  EXPECT_FALSE(s.is_ok());
  EXPECT_TRUE(s.code() == StatusCode::unavailable || s.code() == StatusCode::timeout) << s.to_string();
  fault->set_stall(false);  // the held reply is then late: dropped
  // The client redials; the next pass re-handshakes and works.
  Status ok = dispatch_once_back(**cl, t);
  ASSERT_TRUE(ok.is_ok()) << ok.to_string();
  Status c = (*cl)->combine(0, 0, t);
  ASSERT_TRUE(c.is_ok()) << c.to_string();
  EXPECT_GE(b.workers[0]->stats().peer_losses.load(), 1);
  EXPECT_EQ(b.workers[0]->stats().attention_serving.load(), 1);  // lost, then served again
}

// A pass that fails with several micro-batches in flight (micro-batch 0's combine fails,
// micro-batch 1 was dispatched and never combined) must not poison the next pass: later
// passes must not fail with "dispatch of micro-batch 1 before the previous one was
// combined", so an attention worker recovers from an FFN loss under load.
TEST(FfnAfd, FailedPassWithSeveralMicroBatchesLeavesTheNextOneClean) {
  auto w = tiny_model("a");
  Bundle b;
  FaultTransport* fault = nullptr;
  auto cl = faulty_ffn_bundle(b, w, client_opts(0, 1, 1), &fault);  // 2 micro-batches
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  TokenBatch t0 = random_batch(w->config, 4, 70), t1 = random_batch(w->config, 3, 71);
  fault->set_stall(true);  // no reply gets out before the disconnect (see above)
  ASSERT_TRUE((*cl)->dispatch(0, 0, t0).is_ok());
  ASSERT_TRUE((*cl)->dispatch(0, 1, t1).is_ok());
  ASSERT_TRUE(b.ffn_t[0]->disconnect(*b.ffn_t[0]->peer_id("attn0")).is_ok());
  EXPECT_FALSE((*cl)->combine(0, 0, t0).is_ok());  // the engine gives up the pass here
  fault->set_stall(false);
  Status ok = dispatch_once_back(**cl, t0);
  ASSERT_TRUE(ok.is_ok()) << ok.to_string();
  Status d1 = (*cl)->dispatch(0, 1, t1);
  ASSERT_TRUE(d1.is_ok()) << d1.to_string();
  for (auto [mb, tb] : {std::pair<int, TokenBatch*>{0, &t0}, {1, &t1}}) {
    Status c = (*cl)->combine(0, mb, *tb);
    ASSERT_TRUE(c.is_ok()) << "micro-batch " << mb << ": " << c.to_string();
    auto ref = reference(*w, 0, *tb);
    for (int64_t i = 0; i < tb->n * w->config.hidden_size; ++i) ASSERT_EQ(tb->ffn_out[i], round_bf16(ref[i])) << i;
  }
}

TEST(FfnAfd, HealthSaysWhichFfnWorkerIsNotConnected) {
  auto w = tiny_model("a");
  Bundle b;
  auto cl = one_attention(b, w, 2);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  EXPECT_TRUE((*cl)->health().is_ok()) << (*cl)->health().to_string();
  // FFN worker 1's transport goes away for good (its process died): health says so, from
  // another thread than the engine's, while nothing is being forwarded.
  b.ffn_t[1]->close();
  Status h;
  std::thread checker([&] {
    const int64_t dl = deadline_in_ms(3000);
    while ((h = (*cl)->health()).is_ok() && now_ns() < dl) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  checker.join();
  EXPECT_EQ(h.code(), StatusCode::unavailable) << h.to_string();
  EXPECT_NE(h.message().find("'ffn1'"), std::string::npos) << h.to_string();
}

TEST(FfnAfd, OverUcx) {
  auto w = tiny_model("a");
  std::atomic<bool> stop{false};
  auto ft = UcxTransport::create(UcxOptions{"ffn0"});
  ASSERT_TRUE(ft.ok());
  ASSERT_TRUE((*ft)->listen("127.0.0.1:0").is_ok());
  std::string addr = "127.0.0.1:" + std::to_string((*ft)->listen_port());
  auto wk = FfnWorker::create(w, ft->get(), FfnWorkerOptions{}, nullptr);
  ASSERT_TRUE(wk.ok());
  std::thread th([&] { (void)(*wk)->run(&stop); });
  auto at = UcxTransport::create(UcxOptions{"attn0"});
  ASSERT_TRUE(at.ok());
  FfnClientOptions o = client_opts(0, 1, 1);
  o.ffn_addresses = {addr};
  auto cl = FfnClient::create(w, at->get(), o);
  ASSERT_TRUE(cl.ok()) << cl.status().to_string();
  expect_exact_pass(**cl, *w, 9, 40);
  cl->reset();
  stop = true;
  th.join();
}

}  // namespace
}  // namespace afd
