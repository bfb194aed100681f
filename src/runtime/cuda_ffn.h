// CudaFfn: the FFN half (model/ffn_part.h contract) on an NVIDIA GPU, for FFN workers and
// the monolithic engine (--ffn-device cuda). Optional: built only with -DAFD_CUDA=ON (needs
// nvcc and cuBLAS); without it, or without a visible GPU, create() returns `unavailable`
// with the reason and callers keep the CPU path.
//
// Numerics: the held FFN weights are uploaded once as BF16 (f32 / f16 checkpoints are
// rounded), activations enter each product as BF16 and accumulate in f32 (cuBLAS,
// CUBLAS_COMPUTE_32F), silu(gate)*up is rounded to BF16 before the down projection — the
// same roundings as the CPU's fast precision (kernels::ActPrecision::bf16). Per token the
// routed experts' weighted outputs are summed in slot order, then the shared expert (or
// dense MLP) is added with its sigmoid gate; results are deterministic run to run. The
// measured deviation from the CPU is in docs/ACCURACY.md.
//
// Work is asynchronous: submit() stages the input in pinned host memory of `slot`, enqueues
// the copies, kernels and GEMMs on the object's one CUDA stream and returns; collect()
// waits for that slot and copies out [n, hidden]. One call of each per slot at a time
// (submit, collect, submit, ...); different slots may be in flight together (the engine's
// micro-batches). Not thread-safe: one caller thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/weights.h"
#include "runtime/ffn_backend.h"

namespace afd {

struct CudaFfnOptions {
  int device = 0;                     // CUDA device ordinal
  std::vector<uint8_t> experts_mask;  // empty: every expert; else experts_mask[e] = held
  bool include_shared = true;         // the shared expert and dense layers are held
  int slots = 4;                      // independent submit/collect slots (micro-batches)
  // Decode shapes: when no expert gets more than this many tokens, the experts' products run
  // as one hand-written grouped kernel per projection (kernels::cuda::grouped_skinny_gemm),
  // reading each expert's weights ~once; above it, one cuBLAS GEMM per expert. 0: always cuBLAS.
  // The kernel re-reads the tokens' activations for every weight row and uses no tensor
  // cores, so it loses to cuBLAS as tokens per expert grow (docs/BENCHMARKS.md, H100).
  int skinny_max_tokens = 16;
};

class CudaFfn {
 public:
  // Uploads the held FFN weights of `w` (which may be a TP slice, model/ffn_part.h).
  // unavailable: built without CUDA, no device, or the device cannot be used; resource_exhausted:
  // the weights do not fit in device memory.
  static Result<std::unique_ptr<CudaFfn>> create(std::shared_ptr<const ModelWeights> w, const CudaFfnOptions& opt);
  virtual ~CudaFfn() = default;

  // Enqueues out = ffn_part(layer, h, ids, weights) for n tokens (ids / weights [n, top_k],
  // nullptr for dense layers) on `slot`. Experts outside the mask contribute nothing.
  // invalid_argument: bad slot / layer / expert id (ids are checked on the host: request data
  // never reaches the GPU unchecked); internal: a CUDA or cuBLAS error (then every later
  // call fails too).
  virtual Status submit(int slot, int64_t layer, const float* h, int64_t n, const int32_t* ids,
                        const float* weights) = 0;
  // Waits for slot's work, writes out [n, hidden] of the last submit on that slot.
  // gpu_ms: the GPU time of that work (CUDA events), when non-null.
  virtual Status collect(int slot, float* out, double* gpu_ms = nullptr) = 0;

  // submit + collect on slot 0.
  Status run(int64_t layer, const float* h, int64_t n, const int32_t* ids, const float* weights, float* out);

  virtual std::string device_name() const = 0;
  virtual size_t weight_bytes() const = 0;  // device memory holding the weights
};

// Whether this build has the CUDA backend and a usable device; *why says why not.
bool cuda_ffn_available(std::string* why);

// FfnBackend over a CudaFfn: dispatch() submits (optionally after the FP8 round trip of the
// AFD wire, as LocalFfnBackend does) and returns at once, so the engine runs attention for
// other micro-batches while the GPU computes; combine() collects. ffn_s is GPU time.
class CudaFfnBackend : public FfnBackend {
 public:
  CudaFfnBackend(std::unique_ptr<CudaFfn> gpu, int64_t hidden, bool fp8_dispatch, int64_t fp8_group);
  Status dispatch(int64_t layer, int microbatch, TokenBatch& b) override;
  Status combine(int64_t layer, int microbatch, TokenBatch& b) override;

 private:
  std::unique_ptr<CudaFfn> gpu_;
  int64_t hidden_;
  bool fp8_dispatch_;
  int64_t fp8_group_;
  std::vector<float> hq_;
  std::vector<uint8_t> q8_;
  std::vector<float> scales_;
};

}  // namespace afd
