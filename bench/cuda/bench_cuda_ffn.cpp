// bench_cuda_ffn: the GPU FFN (runtime/cuda_ffn.h) per layer against this GPU's limits,
// measured in the same run. Built only with a CUDA build.
//
//   bench_cuda_ffn --model DIR [--tokens 1,8,32,128,512,2048] [--iters 20]

// Limits (measured first): device memory bandwidth from a 1 GiB device-to-device copy
// (bytes read + written per second) and the bf16 GEMM rate from an 8192^3 cublasGemmEx.
// For each token count n: uniform random routing (distinct top-k experts per token), every
// MoE layer in turn; GPU time per layer from CUDA events (CudaFfn::collect), median over
// iters x layers. Printed per row: time, bytes of the experts touched (+ shared expert), FLOPs,
// their fractions of the limits, and time / max(bytes / bandwidth, flops / rate).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/cuda_ffn.h"

using namespace afd;

namespace {

// Best of 5 timed runs of `work` (after one warm-up), in ms, from CUDA events.
template <class Work>
float best_ms(Work work) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(e0);
    work();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

double device_bandwidth_gbs() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  const float ms = best_ms([&] { cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

double gemm_tflops() {
  const int n = 8192;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  const size_t el = size_t{n} * n;
  if (cudaMalloc(&a, el * 2) != cudaSuccess || cudaMalloc(&b, el * 2) != cudaSuccess ||
      cudaMalloc(&c, el * 4) != cudaSuccess)
    return 0;
  cudaMemset(a, 0x3c, el * 2);  // ~1.1 in bf16: non-zero data
  cudaMemset(b, 0x3c, el * 2);
  cublasHandle_t h;
  cublasCreate(&h);
  const float alpha = 1, beta = 0;
  const float ms = best_ms([&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c,
                 CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU FFN per layer vs this GPU's bandwidth and GEMM rate"};
  std::string model, tokens = "1,8,32,128,512,2048";
  int iters = 20;
  app.add_option("--model", model, "Model directory")->required();
  app.add_option("--tokens", tokens, "Token counts per FFN call");
  app.add_option("--iters", iters, "Timed calls per layer and token count")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);

  auto w = load_model(model);
  if (!w.ok()) {
    std::fprintf(stderr, "bench_cuda_ffn: %s\n", w.status().to_string().c_str());
    return 1;
  }
  auto g = CudaFfn::create(*w, CudaFfnOptions{});
  if (!g.ok()) {
    std::fprintf(stderr, "bench_cuda_ffn: %s\n", g.status().to_string().c_str());
    return 1;
  }
  const ModelConfig& c = (*w)->config;
  const double bw = device_bandwidth_gbs(), rate = gemm_tflops();
  std::printf("device %s: copy bandwidth %.0f GB/s (read+write), bf16 GEMM %.0f TFLOP/s (measured now)\n",
              (*g)->device_name().c_str(), bw, rate);
  std::printf("model %s: hidden %lld, %lld experts top-%lld, moe_intermediate %lld, weights on device %.2f GB\n",
              model.c_str(), (long long)c.hidden_size, (long long)c.n_experts, (long long)c.n_experts_per_tok,
              (long long)c.moe_intermediate_size, (*g)->weight_bytes() / 1e9);
  std::printf("%7s %10s %9s %9s %9s %9s %9s %12s\n", "tokens", "us/layer", "MB", "GFLOP", "bw_frac", "flop_frac",
              "experts", "vs_limit");

  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (c.is_moe_layer(l)) moe_layers.push_back(l);
  const int64_t H = c.hidden_size, K = c.n_experts_per_tok, E = c.n_experts, I = c.moe_intermediate_size;
  const LayerWeights& L0 = (*w)->layers[static_cast<size_t>(moe_layers.empty() ? 0 : moe_layers[0])];
  const int64_t SI = L0.moe.shared.empty() ? 0 : L0.moe.shared.gate.rows;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  size_t pos = 0;
  while (pos <= tokens.size()) {
    size_t end = tokens.find(',', pos);
    if (end == std::string::npos) end = tokens.size();
    const int64_t n = std::stoll(tokens.substr(pos, end - pos));
    pos = end + 1;
    std::vector<float> h(static_cast<size_t>(n * H)), wts(static_cast<size_t>(n * K), 1.0f / K), out(h.size());
    std::vector<int32_t> ids(static_cast<size_t>(n * K));
    for (auto& v : h) v = nd(rng);
    std::set<int32_t> touched;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> pick;
      while (static_cast<int64_t>(pick.size()) < K) {
        const int32_t e = static_cast<int32_t>(rng() % E);
        if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
      }
      for (int64_t j = 0; j < K; ++j) ids[static_cast<size_t>(t * K + j)] = pick[static_cast<size_t>(j)];
      touched.insert(pick.begin(), pick.end());
    }
    std::vector<double> ms;
    for (int it = -2; it < iters; ++it) {
      for (int64_t l : moe_layers) {
        Status s = (*g)->submit(0, l, h.data(), n, ids.data(), wts.data());
        double t = 0;
        if (s.is_ok()) s = (*g)->collect(0, out.data(), &t);
        if (!s.is_ok()) {
          std::fprintf(stderr, "bench_cuda_ffn: %s\n", s.to_string().c_str());
          return 1;
        }
        if (it >= 0) ms.push_back(t);
      }
    }
    std::sort(ms.begin(), ms.end());
    const double t_s = ms[ms.size() / 2] * 1e-3;
    const double bytes = (double(touched.size()) * 3 * H * I + 3.0 * H * SI) * 2;
    const double flops = 2.0 * n * (K * 3.0 * H * I + 3.0 * H * SI);
    const double limit = std::max(bytes / (bw * 1e9), flops / (rate * 1e12));
    std::printf("%7lld %10.1f %9.1f %9.2f %9.3f %9.3f %9zu %11.2fx\n", (long long)n, t_s * 1e6, bytes / 1e6,
                flops / 1e9, bytes / t_s / (bw * 1e9), flops / t_s / (rate * 1e12), touched.size(), t_s / limit);
  }
  return 0;
}
