// The GPU FFN (runtime/cuda_ffn.h) against the CPU's ffn_part on the same inputs, and the
// engines built on it. Labelled `gpu`: every case skips when this build has no CUDA backend
// or no GPU is visible (CI), with the reason.
//
// Tolerances: the GPU rounds activations and weights to BF16 (f32 accumulation), as the CPU's
// fast precision does, but sums in another order; so it is held to the CPU bf16 result within
// a relative L2 error of 1e-2, and to the f32 result within 2e-2 (measured values are printed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "model/ffn_part.h"
#include "../model/model_test_util.h"
#include "model/tools/make_model.h"
#include "model/weights.h"
#include "runtime/cuda_ffn.h"
#include "runtime/engine_factory.h"

namespace afd {
namespace {

#define SKIP_WITHOUT_GPU()                                     \
  do {                                                         \
    std::string why_;                                          \
    if (!cuda_ffn_available(&why_)) GTEST_SKIP() << why_;      \
  } while (0)

// qwen2_moe tiny (8 experts, top-2, gated shared expert); layer 1 dense.
std::shared_ptr<const ModelWeights> tiny_model(DType dtype = DType::bf16) {
  static std::map<int, std::shared_ptr<const ModelWeights>> cache;
  const int key = static_cast<int>(dtype);
  if (cache.count(key)) return cache[key];
  auto c = make_preset_config(Arch::qwen2_moe, "tiny");
  EXPECT_TRUE(c.ok());
  c->n_layers = 3;
  c->mlp_only_layers = {1};
  MakeModelOptions o;
  o.out_dir = test::process_scratch_dir("afd_test_cuda_ffn_" + std::to_string(key));  // removed at exit
  o.seed = 5;
  o.dtype = dtype;
  auto r = make_model(*c, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  auto w = load_model(o.out_dir);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  cache[key] = *w;
  return *w;
}

struct Input {
  int64_t n = 0;
  std::vector<float> h, w;
  std::vector<int32_t> ids;
};

Input random_input(const ModelConfig& c, int64_t n, uint32_t seed) {
  Input in;
  in.n = n;
  const int64_t K = c.n_experts_per_tok;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  in.h.resize(static_cast<size_t>(n * c.hidden_size));
  for (auto& v : in.h) v = nd(rng);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> pick;
    while (static_cast<int64_t>(pick.size()) < K) {
      const int32_t e = static_cast<int32_t>(rng() % c.n_experts);
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    float sum = 0;
    std::vector<float> ws;
    for (int64_t j = 0; j < K; ++j) ws.push_back(0.1f + static_cast<float>(rng() % 1000) / 1000.0f), sum += ws.back();
    for (int64_t j = 0; j < K; ++j) {
      in.ids.push_back(pick[static_cast<size_t>(j)]);
      in.w.push_back(ws[static_cast<size_t>(j)] / sum);
    }
  }
  return in;
}

std::vector<float> cpu_ffn(const ModelWeights& w, int64_t layer, const Input& in, kernels::ActPrecision prec,
                           const FfnPartOptions* base = nullptr) {
  FfnPartOptions o = base ? *base : FfnPartOptions{};
  o.prec = prec;
  FfnScratch scratch;
  std::vector<float> out(in.h.size());
  const bool moe = w.config.is_moe_layer(layer);
  ffn_part(w, layer, in.h.data(), in.n, moe ? in.ids.data() : nullptr, moe ? in.w.data() : nullptr, out.data(), o,
           &scratch, nullptr);
  return out;
}

std::vector<float> gpu_ffn(CudaFfn& g, int64_t layer, const Input& in, bool moe) {
  std::vector<float> out(in.h.size(), NAN);
  Status s = g.run(layer, in.h.data(), in.n, moe ? in.ids.data() : nullptr, moe ? in.w.data() : nullptr, out.data());
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void expect_close(const std::vector<float>& gpu, const ModelWeights& w, int64_t layer, const Input& in,
                  const FfnPartOptions* base = nullptr) {
  const double e_bf16 = rel_l2(gpu, cpu_ffn(w, layer, in, kernels::ActPrecision::bf16, base));
  const double e_f32 = rel_l2(gpu, cpu_ffn(w, layer, in, kernels::ActPrecision::f32, base));
  std::printf("layer %lld n %lld: rel L2 vs CPU bf16 %.2e, vs CPU f32 %.2e\n", (long long)layer, (long long)in.n,
              e_bf16, e_f32);
  EXPECT_LT(e_bf16, 1e-2);
  EXPECT_LT(e_f32, 2e-2);
}

TEST(CudaFfn, MatchesCpuOnMoeDenseAndSharedLayers) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::bf16, DType::f32}) {
    auto w = tiny_model(dt);
    auto g = CudaFfn::create(w, CudaFfnOptions{});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    for (int64_t n : {1, 7, 64}) {
      Input in = random_input(w->config, n, static_cast<uint32_t>(n));
      for (int64_t layer = 0; layer < w->config.n_layers; ++layer)
        expect_close(gpu_ffn(**g, layer, in, w->config.is_moe_layer(layer)), *w, layer, in);
    }
  }
}

// The grouped decode kernel (few tokens per expert) and the per-expert cuBLAS path compute
// the same products; n = 1, 9, 100 with skinny_max_tokens 64 exercise one and several
// 32-token passes of the kernel, n = 300 puts more than 64 on some expert (cuBLAS in both).
TEST(CudaFfn, GroupedKernelAndCublasAgree) {
  SKIP_WITHOUT_GPU();
  auto w = tiny_model();
  CudaFfnOptions blas, skinny;
  blas.skinny_max_tokens = 0;
  skinny.skinny_max_tokens = 64;
  auto g = CudaFfn::create(w, skinny);
  auto gb = CudaFfn::create(w, blas);
  ASSERT_TRUE(g.ok() && gb.ok());
  for (int64_t n : {1, 9, 100, 300}) {
    Input in = random_input(w->config, n, static_cast<uint32_t>(7 * n));
    const auto a = gpu_ffn(**g, 0, in, true), b = gpu_ffn(**gb, 0, in, true);
    std::printf("n %lld: grouped kernel vs cuBLAS rel L2 %.2e\n", (long long)n, rel_l2(a, b));
    EXPECT_LT(rel_l2(a, b), 1e-5);
    expect_close(b, *w, 0, in);
    expect_close(a, *w, 0, in);
  }
}

TEST(CudaFfn, ExpertShardAndTensorSliceArePartialSums) {
  SKIP_WITHOUT_GPU();
  auto w = tiny_model();
  const int64_t E = w->config.n_experts;
  Input in = random_input(w->config, 33, 9);
  // EP: experts [0, E/2) without the shared expert, against ffn_part with the same mask.
  CudaFfnOptions co;
  co.experts_mask.assign(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E / 2; ++e) co.experts_mask[static_cast<size_t>(e)] = 1;
  co.include_shared = false;
  auto g = CudaFfn::create(w, co);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  FfnPartOptions po;
  po.experts_mask = co.experts_mask;
  po.include_shared = false;
  expect_close(gpu_ffn(**g, 0, in, true), *w, 0, in, &po);
  // A dense layer not held gives zeros.
  auto dense = gpu_ffn(**g, 1, in, false);
  for (float v : dense) ASSERT_EQ(v, 0.0f);

  // TP: the two ranks' partial outputs add up to the full FFN.
  std::vector<float> sum(in.h.size(), 0.0f);
  for (int r = 0; r < 2; ++r) {
    FfnTpSlice sl;
    sl.rank = r;
    sl.degree = 2;
    auto ws = slice_ffn_tp(w, sl);
    ASSERT_TRUE(ws.ok()) << ws.status().to_string();
    auto gr = CudaFfn::create(*ws, CudaFfnOptions{});
    ASSERT_TRUE(gr.ok()) << gr.status().to_string();
    auto part = gpu_ffn(**gr, 0, in, true);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  expect_close(sum, *w, 0, in);
}

TEST(CudaFfn, SlotsInFlightAreIndependentAndDeterministic) {
  SKIP_WITHOUT_GPU();
  auto w = tiny_model();
  auto g = CudaFfn::create(w, CudaFfnOptions{});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  std::vector<Input> ins;
  std::vector<std::vector<float>> alone;
  for (int s = 0; s < 3; ++s) {
    ins.push_back(random_input(w->config, 5 + 20 * s, 100 + s));  // growing sizes: scratch grows mid-flight
    alone.push_back(gpu_ffn(**g, 0, ins.back(), true));
  }
  for (int s = 0; s < 3; ++s)
    ASSERT_TRUE((*g)->submit(s, 0, ins[s].h.data(), ins[s].n, ins[s].ids.data(), ins[s].w.data()).is_ok());
  for (int s = 2; s >= 0; --s) {
    std::vector<float> out(ins[s].h.size());
    double ms = -1;
    ASSERT_TRUE((*g)->collect(s, out.data(), &ms).is_ok());
    EXPECT_GE(ms, 0.0);
    EXPECT_EQ(out, alone[s]) << "slot " << s;  // bitwise: same work, fixed summation order
  }
}

TEST(CudaFfn, BadRequestsAreErrorsAndLeaveItUsable) {
  SKIP_WITHOUT_GPU();
  auto w = tiny_model();
  auto g = CudaFfn::create(w, CudaFfnOptions{});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  Input in = random_input(w->config, 4, 1);
  const auto good = gpu_ffn(**g, 0, in, true);
  Input bad = in;
  bad.ids[3] = static_cast<int32_t>(w->config.n_experts);
  std::vector<float> out(in.h.size());
  Status s = (*g)->run(0, bad.h.data(), bad.n, bad.ids.data(), bad.w.data(), out.data());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_EQ((*g)->run(99, in.h.data(), in.n, in.ids.data(), in.w.data(), out.data()).code(),
            StatusCode::invalid_argument);
  EXPECT_EQ((*g)->collect(1, out.data()).code(), StatusCode::invalid_argument);  // nothing submitted
  EXPECT_EQ(gpu_ffn(**g, 0, in, true), good);
  CudaFfnOptions far;
  far.device = 1000;
  EXPECT_EQ(CudaFfn::create(w, far).status().code(), StatusCode::unavailable);
}

// Greedy tokens of two prompts, 8 steps.
std::vector<int32_t> greedy(Engine& e, std::vector<float>* logits_out) {
  const int64_t V = e.config().vocab_size;
  std::vector<std::vector<int32_t>> next = {{1, 5, 9, 13, 2}, {1, 7, 3}};
  std::vector<int64_t> seqs = {*e.create_sequence(), *e.create_sequence()};
  std::vector<int32_t> toks;
  for (int s = 0; s < 8; ++s) {
    std::vector<BatchItem> items;
    for (size_t i = 0; i < seqs.size(); ++i) items.push_back(BatchItem{seqs[i], next[i], false});
    std::vector<float> logits;
    Status st = e.forward(items, &logits);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) return toks;
    logits_out->insert(logits_out->end(), logits.begin(), logits.end());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const float* row = logits.data() + static_cast<int64_t>(i) * V;
      toks.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
      next[i] = {toks.back()};
    }
  }
  return toks;
}

TEST(CudaFfn, MonolithicAndAfdEnginesDecodeLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::string dir = AFD_SOURCE_DIR "/tests/reference/data/qwen2moe_shared";
  auto w = load_model(dir);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto run = [&](const std::string& topo, const std::string& device, int mb, std::vector<float>* logits) {
    EngineOptions o;
    o.model_dir = dir;
    o.precision = Precision::fast;
    o.kv.capacity_tokens = 256;
    o.kv.max_seqs = 4;
    o.n_threads = 1;
    o.topology = *parse_topology(topo);
    o.microbatches = mb;
    o.emulation.fp8_dispatch = true;
    o.ffn_device = device;
    auto e = make_engine(o, *w);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? greedy(**e, logits) : std::vector<int32_t>{};
  };
  std::vector<float> cpu_l, gpu_l, afd_l;
  const auto cpu = run("mono", "cpu", 1, &cpu_l);
  const auto gpu = run("mono", "cuda", 2, &gpu_l);
  const auto afd = run("1A2F", "cuda", 3, &afd_l);  // in-process FFN workers on the GPU
  EXPECT_EQ(gpu, cpu);
  EXPECT_EQ(afd, gpu);
  ASSERT_EQ(gpu_l.size(), cpu_l.size());
  ASSERT_EQ(afd_l.size(), cpu_l.size());
  std::printf("logits rel L2: mono cuda vs cpu %.2e, 1A2F cuda vs mono cuda %.2e\n", rel_l2(gpu_l, cpu_l),
              rel_l2(afd_l, gpu_l));
  EXPECT_LT(rel_l2(gpu_l, cpu_l), 2e-2);
  EXPECT_LT(rel_l2(afd_l, gpu_l), 2e-2);
}

}  // namespace
}  // namespace afd
