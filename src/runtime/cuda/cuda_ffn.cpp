// CudaFfn on CUDA + cuBLAS (built with AFD_CUDA). See runtime/cuda_ffn.h for the contract.
//
// One submit() on a MoE layer, all on the object's stream:
//   1. host: (token, slot) pairs of held experts bucketed by expert (counting sort, token
//      order kept inside a bucket, as model/ffn_part.cpp does) -> rows / slots / weights
//   2. copy h and those arrays to the device; zero slot_out [n*k, hidden]
//   3. xs = bf16(h[rows])                                   [M, hidden]
//   4. per expert e with m_e rows: gu_e = xs_e . [gate_e | up_e]^T  (cuBLAS, f32 out)
//   5. act = bf16(silu(gate) * up) for all M rows, then per expert y_e = act_e . down_e^T
//   6. slot_out[slot] = w * y; out[t] = sum over t's k slots (slot order)
//   7. shared expert (when held): the same over all n tokens, added with its sigmoid gate
//   8. copy out to the slot's pinned buffer; an event marks the slot done
// Device scratch is shared by all slots: the stream orders the slots' work.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cuda/moe_kernels.h"
#include "runtime/cuda_ffn.h"

namespace afd {

namespace {

namespace kc = kernels::cuda;

std::string cuda_error(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

// A held SwiGLU FFN on the device: gu [2*inter, hidden] (gate rows then up rows), down [hidden, inter], bf16.
struct DevFfn {
  uint16_t* gu = nullptr;
  uint16_t* down = nullptr;
  int64_t inter = 0;
  bool held() const { return gu != nullptr; }
};

struct DevLayer {
  bool moe = false;
  std::vector<DevFfn> experts;  // MoE: n_experts entries (unheld ones empty)
  DevFfn shared;                // MoE shared expert, or the dense MLP
  float* shared_gate = nullptr; // [hidden] f32, or null (no gate)
};

// Device or pinned-host memory that only grows.
template <class T, bool Pinned>
struct Grow {
  T* p = nullptr;
  size_t cap = 0;
  cudaError_t reserve(size_t n) {
    if (n <= cap) return cudaSuccess;
    if (p != nullptr) {
      if (Pinned) cudaFreeHost(p); else cudaFree(p);
      p = nullptr;
      cap = 0;
    }
    void* q = nullptr;
    cudaError_t e = Pinned ? cudaHostAlloc(&q, n * sizeof(T), cudaHostAllocDefault) : cudaMalloc(&q, n * sizeof(T));
    if (e != cudaSuccess) return e;
    p = static_cast<T*>(q);
    cap = n;
    return cudaSuccess;
  }
  void release() {
    if (p != nullptr) {
      if (Pinned) cudaFreeHost(p); else cudaFree(p);
    }
    p = nullptr;
    cap = 0;
  }
};

struct Slot {
  // Grouped-kernel arguments: [G] gate_up weight pointers | [G] down pointers | [G] row
  // offsets | [G] row counts, packed in pinned memory and copied to the slot's device region.
  Grow<uint8_t, true> groups;
  Grow<float, true> h, out;
  Grow<int32_t, true> rows, slots;
  Grow<float, true> w;
  cudaEvent_t start = nullptr, done = nullptr;
  int64_t n = -1;  // tokens of the submit in flight; -1: none
};

class CudaFfnImpl final : public CudaFfn {
 public:
  ~CudaFfnImpl() override;
  Status init(std::shared_ptr<const ModelWeights> w, const CudaFfnOptions& opt);
  Status submit(int slot, int64_t layer, const float* h, int64_t n, const int32_t* ids, const float* weights) override;
  Status collect(int slot, float* out, double* gpu_ms) override;
  std::string device_name() const override { return name_; }
  size_t weight_bytes() const override { return weight_bytes_; }

 private:
  Status fail(const std::string& why) {
    broken_ = internal_error("CUDA FFN on device " + std::to_string(device_) + ": " + why);
    return broken_;
  }
  Status upload_ffn(const FfnWeights& f, DevFfn* d);
  Result<uint16_t*> upload(const std::vector<uint16_t>& host);
  // y [m, out] f32 = x [m, in] bf16 . W^T with W [out, in] bf16 row-major.
  Status gemm(const uint16_t* W, int64_t out, int64_t in, const uint16_t* x, int64_t m, float* y);
  // out [n, hidden] (+)= swiglu_f(rows of h); xs/gu/act/y sized by the caller.
  Status swiglu(const DevFfn& f, int64_t m, const uint16_t* xs, float* y);
  Status ensure_scratch(int64_t n, int64_t m, int64_t k, int64_t width);

  std::shared_ptr<const ModelWeights> w_;
  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::vector<DevLayer> layers_;
  std::vector<void*> allocations_;
  size_t weight_bytes_ = 0;
  std::vector<Slot> slots_;
  Status broken_ = Status();
  // Device scratch shared by all slots (stream-ordered).
  Grow<float, false> d_h_, d_w_, d_gu_, d_y_, d_slot_out_, d_out_;
  Grow<int32_t, false> d_rows_, d_slots_;
  Grow<uint16_t, false> d_xs_, d_act_;
  Grow<uint8_t, false> d_groups_;  // [slots][group_bytes_] device copies of Slot::groups
  size_t group_bytes_ = 0;
  int skinny_max_tokens_ = 16;
  // Host scratch of submit().
  std::vector<int32_t> count_;
};

#define AFD_CUDA_TRY(expr)                                         \
  do {                                                             \
    const cudaError_t e_ = (expr);                                 \
    if (e_ != cudaSuccess) return fail(cuda_error(#expr, e_));     \
  } while (0)

CudaFfnImpl::~CudaFfnImpl() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (Slot& s : slots_) {
    s.h.release();
    s.out.release();
    s.rows.release();
    s.slots.release();
    s.w.release();
    s.groups.release();
    if (s.start) cudaEventDestroy(s.start);
    if (s.done) cudaEventDestroy(s.done);
  }
  d_h_.release(); d_w_.release(); d_gu_.release(); d_y_.release(); d_slot_out_.release(); d_out_.release();
  d_rows_.release(); d_slots_.release(); d_xs_.release(); d_act_.release(); d_groups_.release();
  for (void* p : allocations_) cudaFree(p);
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

// Appends m's elements as bf16 to host (f32 is rounded to nearest even).
Status append_bf16(const Matrix& m, std::vector<uint16_t>* host) {
  const size_t count = static_cast<size_t>(m.rows * m.cols);
  const size_t at = host->size();
  host->resize(at + count);
  if (m.dtype == DType::bf16) {
    std::memcpy(host->data() + at, m.data, count * sizeof(uint16_t));
  } else if (m.dtype == DType::f32) {
    const float* f = static_cast<const float*>(m.data);
    for (size_t i = 0; i < count; ++i) (*host)[at + i] = f32_to_bf16(f[i]).bits;
  } else {
    return invalid_argument(std::string("CUDA FFN: unsupported weight dtype ") + dtype_name(m.dtype));
  }
  return Status();
}

Result<uint16_t*> CudaFfnImpl::upload(const std::vector<uint16_t>& host) {
  void* d = nullptr;
  const size_t bytes = host.size() * sizeof(uint16_t);
  cudaError_t e = cudaMalloc(&d, bytes);
  if (e != cudaSuccess) return resource_exhausted(cuda_error("CUDA FFN: cudaMalloc of the weights", e));
  allocations_.push_back(d);
  e = cudaMemcpy(d, host.data(), bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return fail(cuda_error("cudaMemcpy of the weights", e));
  weight_bytes_ += bytes;
  return static_cast<uint16_t*>(d);
}

Status CudaFfnImpl::upload_ffn(const FfnWeights& f, DevFfn* d) {
  if (f.empty()) return Status();
  const int64_t inter = f.gate.rows, hid = f.gate.cols;
  if (f.up.rows != inter || f.up.cols != hid || f.down.rows != hid || f.down.cols != inter)
    return invalid_argument("CUDA FFN: gate/up/down shapes disagree");
  std::vector<uint16_t> host;
  host.reserve(static_cast<size_t>(2 * inter * hid));
  AFD_RETURN_IF_ERROR(append_bf16(f.gate, &host));  // gu = [gate; up]: one product yields both halves
  AFD_RETURN_IF_ERROR(append_bf16(f.up, &host));
  AFD_ASSIGN_OR_RETURN(d->gu, upload(host));
  host.clear();
  AFD_RETURN_IF_ERROR(append_bf16(f.down, &host));
  AFD_ASSIGN_OR_RETURN(d->down, upload(host));
  d->inter = inter;
  return Status();
}

Status CudaFfnImpl::init(std::shared_ptr<const ModelWeights> w, const CudaFfnOptions& opt) {
  w_ = std::move(w);
  device_ = opt.device;
  skinny_max_tokens_ = opt.skinny_max_tokens;
  const ModelConfig& c = w_->config;
  if (opt.slots < 1 || opt.slots > 64) return invalid_argument("CUDA FFN: slots must be in [1, 64]");
  if (!opt.experts_mask.empty() && static_cast<int64_t>(opt.experts_mask.size()) != c.n_experts)
    return invalid_argument("CUDA FFN: experts mask has " + std::to_string(opt.experts_mask.size()) +
                            " entries for " + std::to_string(c.n_experts) + " experts");
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return unavailable(cuda_error("CUDA FFN: no usable GPU (cudaGetDeviceCount)", e));
  if (device_ < 0 || device_ >= count)
    return unavailable("CUDA FFN: device " + std::to_string(device_) + " requested, " + std::to_string(count) +
                       " visible");
  AFD_CUDA_TRY(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  AFD_CUDA_TRY(cudaGetDeviceProperties(&prop, device_));
  name_ = prop.name;
  AFD_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) return fail("cublasCreate failed");
  if (cublasSetStream(blas_, stream_) != CUBLAS_STATUS_SUCCESS) return fail("cublasSetStream failed");
  // Plain f32 accumulation: no TF32 / reduced-precision shortcuts.
  if (cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) return fail("cublasSetMathMode failed");

  // Fit check before uploading: what the held FFNs need against free device memory.
  size_t need = 0;
  auto held = [&](int64_t e2) { return opt.experts_mask.empty() || opt.experts_mask[static_cast<size_t>(e2)] != 0; };
  for (const LayerWeights& L : w_->layers) {
    if (L.is_moe) {
      for (int64_t x = 0; x < static_cast<int64_t>(L.moe.experts.size()); ++x) {
        const FfnWeights& f = L.moe.experts[static_cast<size_t>(x)];
        if (held(x) && !f.empty()) need += (f.gate.rows * f.gate.cols * 3) * sizeof(uint16_t);
      }
      if (opt.include_shared && !L.moe.shared.empty())
        need += (L.moe.shared.gate.rows * L.moe.shared.gate.cols * 3) * sizeof(uint16_t);
    } else if (opt.include_shared && !L.dense.empty()) {
      need += (L.dense.gate.rows * L.dense.gate.cols * 3) * sizeof(uint16_t);
    }
  }
  size_t free_b = 0, total_b = 0;
  AFD_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  if (need > free_b)
    return resource_exhausted("CUDA FFN: the held FFN weights need " + std::to_string(need >> 20) + " MiB, device " +
                              std::to_string(device_) + " (" + name_ + ") has " + std::to_string(free_b >> 20) +
                              " MiB free; hold fewer experts per worker (--shard)");

  layers_.resize(w_->layers.size());
  for (size_t l = 0; l < w_->layers.size(); ++l) {
    const LayerWeights& L = w_->layers[l];
    DevLayer& D = layers_[l];
    D.moe = L.is_moe;
    if (L.is_moe) {
      D.experts.resize(L.moe.experts.size());
      for (size_t x = 0; x < L.moe.experts.size(); ++x) {
        if (!held(static_cast<int64_t>(x))) continue;
        if (L.moe.experts[x].empty())
          return invalid_argument("CUDA FFN: expert " + std::to_string(x) + " of layer " + std::to_string(l) +
                                  " is in the mask but not in these weights");
        AFD_RETURN_IF_ERROR(upload_ffn(L.moe.experts[x], &D.experts[x]));
      }
      if (opt.include_shared) {
        AFD_RETURN_IF_ERROR(upload_ffn(L.moe.shared, &D.shared));
        if (!L.moe.shared.empty() && !L.moe.shared_gate.empty()) {
          const Matrix& g = L.moe.shared_gate;
          std::vector<float> gf(static_cast<size_t>(g.cols));
          for (int64_t i = 0; i < g.cols; ++i)
            gf[static_cast<size_t>(i)] = g.dtype == DType::f32 ? static_cast<const float*>(g.data)[i]
                                                               : bf16_to_f32(static_cast<const uint16_t*>(g.data)[i]);
          void* d = nullptr;
          AFD_CUDA_TRY(cudaMalloc(&d, gf.size() * sizeof(float)));
          allocations_.push_back(d);
          AFD_CUDA_TRY(cudaMemcpy(d, gf.data(), gf.size() * sizeof(float), cudaMemcpyHostToDevice));
          D.shared_gate = static_cast<float*>(d);
        }
      }
    } else if (opt.include_shared) {
      if (L.dense.empty()) return invalid_argument("CUDA FFN: dense layer " + std::to_string(l) + " not in these weights");
      AFD_RETURN_IF_ERROR(upload_ffn(L.dense, &D.shared));
    }
  }
  slots_.resize(static_cast<size_t>(opt.slots));
  for (Slot& s : slots_) {
    AFD_CUDA_TRY(cudaEventCreate(&s.start));
    AFD_CUDA_TRY(cudaEventCreate(&s.done));
  }
  count_.resize(static_cast<size_t>(c.n_experts) + 1);
  group_bytes_ = static_cast<size_t>(std::max<int64_t>(c.n_experts, 1)) * (2 * sizeof(void*) + 2 * sizeof(int32_t));
  AFD_CUDA_TRY(d_groups_.reserve(group_bytes_ * slots_.size()));
  for (Slot& s : slots_) AFD_CUDA_TRY(s.groups.reserve(group_bytes_));
  return Status();
}

Status CudaFfnImpl::gemm(const uint16_t* W, int64_t out, int64_t in, const uint16_t* x, int64_t m, float* y) {
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: W row-major [out, in] is W^T col-major (ld in); x row-major [m, in] is
  // x^T col-major (ld in); y^T [out, m] = op(W^T)^T ... i.e. y^T = W . x^T with ld out.
  const cublasStatus_t s = cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(m),
                                        static_cast<int>(in), &alpha, W, CUDA_R_16BF, static_cast<int>(in), x,
                                        CUDA_R_16BF, static_cast<int>(in), &beta, y, CUDA_R_32F, static_cast<int>(out),
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) return fail(std::string("cublasGemmEx: ") + cublasGetStatusString(s));
  return Status();
}

Status CudaFfnImpl::swiglu(const DevFfn& f, int64_t m, const uint16_t* xs, float* y) {
  const int64_t hid = w_->config.hidden_size;
  AFD_RETURN_IF_ERROR(gemm(f.gu, 2 * f.inter, hid, xs, m, d_gu_.p));
  AFD_CUDA_TRY(kc::silu_mul_bf16(d_gu_.p, m, f.inter, d_act_.p, stream_));
  return gemm(f.down, hid, f.inter, d_act_.p, m, y);
}

Status CudaFfnImpl::ensure_scratch(int64_t n, int64_t m, int64_t k, int64_t width) {
  const size_t hid = static_cast<size_t>(w_->config.hidden_size);
  const size_t rows = static_cast<size_t>(std::max<int64_t>({n, m, 1}));
  const size_t need_xs = rows * hid, need_gu = rows * 2 * static_cast<size_t>(width);
  const size_t need_slot = static_cast<size_t>(std::max<int64_t>(n * k, 1)) * hid;
  const bool grow = need_xs > d_xs_.cap || need_gu > d_gu_.cap || need_slot > d_slot_out_.cap ||
                    static_cast<size_t>(std::max<int64_t>(m, 1)) > d_rows_.cap;
  if (!grow) return Status();
  // Earlier slots' work may still read the old buffers.
  AFD_CUDA_TRY(cudaStreamSynchronize(stream_));
  AFD_CUDA_TRY(d_h_.reserve(rows * hid));
  AFD_CUDA_TRY(d_out_.reserve(rows * hid));
  AFD_CUDA_TRY(d_y_.reserve(rows * hid));
  AFD_CUDA_TRY(d_xs_.reserve(need_xs));
  AFD_CUDA_TRY(d_gu_.reserve(need_gu));
  AFD_CUDA_TRY(d_act_.reserve(rows * static_cast<size_t>(width)));
  AFD_CUDA_TRY(d_slot_out_.reserve(need_slot));
  AFD_CUDA_TRY(d_rows_.reserve(rows));
  AFD_CUDA_TRY(d_slots_.reserve(rows));
  AFD_CUDA_TRY(d_w_.reserve(rows));
  return Status();
}

Status CudaFfnImpl::submit(int slot, int64_t layer, const float* h, int64_t n, const int32_t* ids,
                           const float* weights) {
  if (!broken_.is_ok()) return broken_;
  const ModelConfig& c = w_->config;
  if (slot < 0 || slot >= static_cast<int>(slots_.size()))
    return invalid_argument("CUDA FFN: slot " + std::to_string(slot) + " outside [0, " + std::to_string(slots_.size()) + ")");
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size()))
    return invalid_argument("CUDA FFN: layer " + std::to_string(layer) + " outside the model");
  if (n < 0) return invalid_argument("CUDA FFN: negative token count");
  Slot& S = slots_[static_cast<size_t>(slot)];
  if (S.n >= 0) return invalid_argument("CUDA FFN: slot " + std::to_string(slot) + " submitted twice without collect");
  const DevLayer& D = layers_[static_cast<size_t>(layer)];
  const int64_t hid = c.hidden_size;
  const int64_t K = D.moe ? c.n_experts_per_tok : 0;
  const int64_t E = c.n_experts;
  if (D.moe && n > 0 && (ids == nullptr || weights == nullptr))
    return invalid_argument("CUDA FFN: a MoE layer needs expert ids and weights");

  // 1. Bucket held (token, slot) pairs by expert.
  int64_t M = 0;
  int64_t width = D.shared.inter;
  if (K > 0) {
    std::fill(count_.begin(), count_.end(), 0);
    for (int64_t t = 0; t < n * K; ++t) {
      if (ids[t] < 0 || ids[t] >= E)
        return invalid_argument("CUDA FFN: expert id " + std::to_string(ids[t]) + " outside [0, " + std::to_string(E) + ")");
      if (D.experts[static_cast<size_t>(ids[t])].held()) count_[static_cast<size_t>(ids[t]) + 1]++;
    }
    for (int64_t x = 0; x < E; ++x) count_[static_cast<size_t>(x) + 1] += count_[static_cast<size_t>(x)];
    M = count_[static_cast<size_t>(E)];
    for (const DevFfn& f : D.experts) width = std::max(width, f.inter);
  }
  AFD_RETURN_IF_ERROR(ensure_scratch(n, M, K, std::max<int64_t>(width, 1)));
  AFD_CUDA_TRY(S.h.reserve(static_cast<size_t>(std::max<int64_t>(n * hid, 1))));
  AFD_CUDA_TRY(S.out.reserve(static_cast<size_t>(std::max<int64_t>(n * hid, 1))));
  AFD_CUDA_TRY(S.rows.reserve(static_cast<size_t>(std::max<int64_t>(M, 1))));
  AFD_CUDA_TRY(S.slots.reserve(static_cast<size_t>(std::max<int64_t>(M, 1))));
  AFD_CUDA_TRY(S.w.reserve(static_cast<size_t>(std::max<int64_t>(M, 1))));
  std::memcpy(S.h.p, h, static_cast<size_t>(n * hid) * sizeof(float));
  if (K > 0) {
    std::vector<int32_t> fill(count_.begin(), count_.end() - 1);
    for (int64_t t = 0; t < n * K; ++t) {
      const int32_t x = ids[t];
      if (!D.experts[static_cast<size_t>(x)].held()) continue;
      const int32_t r = fill[static_cast<size_t>(x)]++;
      S.rows.p[r] = static_cast<int32_t>(t / K);
      S.slots.p[r] = static_cast<int32_t>(t);
      S.w.p[r] = weights[t];
    }
  }

  // 2.-8. Enqueue.
  AFD_CUDA_TRY(cudaSetDevice(device_));
  AFD_CUDA_TRY(cudaEventRecord(S.start, stream_));
  const size_t hbytes = static_cast<size_t>(n * hid) * sizeof(float);
  if (n > 0) AFD_CUDA_TRY(cudaMemcpyAsync(d_h_.p, S.h.p, hbytes, cudaMemcpyHostToDevice, stream_));
  if (n > 0) AFD_CUDA_TRY(cudaMemsetAsync(d_out_.p, 0, hbytes, stream_));
  if (K > 0 && M > 0) {
    AFD_CUDA_TRY(cudaMemcpyAsync(d_rows_.p, S.rows.p, M * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    AFD_CUDA_TRY(cudaMemcpyAsync(d_slots_.p, S.slots.p, M * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    AFD_CUDA_TRY(cudaMemcpyAsync(d_w_.p, S.w.p, M * sizeof(float), cudaMemcpyHostToDevice, stream_));
    AFD_CUDA_TRY(cudaMemsetAsync(d_slot_out_.p, 0, static_cast<size_t>(n * K * hid) * sizeof(float), stream_));
    AFD_CUDA_TRY(kc::gather_rows_bf16(d_h_.p, hid, d_rows_.p, M, d_xs_.p, stream_));
    // Every routed expert of a layer has the same intermediate size (moe_intermediate_size).
    const int64_t inter = D.experts[static_cast<size_t>(ids[S.slots.p[0]])].inter;
    int64_t most = 0;
    int32_t G = 0;
    for (int64_t x = 0; x < E; ++x) {
      const int64_t m = count_[static_cast<size_t>(x) + 1] - count_[static_cast<size_t>(x)];
      most = std::max(most, m);
      G += m > 0 ? 1 : 0;
    }
    if (most <= skinny_max_tokens_ && hid % 8 == 0 && inter % 8 == 0) {
      // One grouped kernel per projection (decode shapes).
      const uint16_t** wgu = reinterpret_cast<const uint16_t**>(S.groups.p);
      const uint16_t** wdn = wgu + G;
      int32_t* goff = reinterpret_cast<int32_t*>(wdn + G);
      int32_t* gm = goff + G;
      int32_t g = 0;
      for (int64_t x = 0; x < E; ++x) {
        const int64_t o = count_[static_cast<size_t>(x)], m = count_[static_cast<size_t>(x) + 1] - o;
        if (m == 0) continue;
        wgu[g] = D.experts[static_cast<size_t>(x)].gu;
        wdn[g] = D.experts[static_cast<size_t>(x)].down;
        goff[g] = static_cast<int32_t>(o);
        gm[g] = static_cast<int32_t>(m);
        ++g;
      }
      uint8_t* dg = d_groups_.p + static_cast<size_t>(slot) * group_bytes_;
      const size_t used = static_cast<size_t>(G) * (2 * sizeof(void*) + 2 * sizeof(int32_t));
      AFD_CUDA_TRY(cudaMemcpyAsync(dg, S.groups.p, used, cudaMemcpyHostToDevice, stream_));
      const uint16_t* const* dwgu = reinterpret_cast<const uint16_t* const*>(dg);
      const int32_t* dgoff = reinterpret_cast<const int32_t*>(dwgu + 2 * G);
      AFD_CUDA_TRY(kc::grouped_skinny_gemm(dwgu, dgoff, dgoff + G, G, 2 * inter, hid, d_xs_.p, d_gu_.p, stream_));
      AFD_CUDA_TRY(kc::silu_mul_bf16(d_gu_.p, M, inter, d_act_.p, stream_));
      AFD_CUDA_TRY(kc::grouped_skinny_gemm(dwgu + G, dgoff, dgoff + G, G, hid, inter, d_act_.p, d_y_.p, stream_));
    } else {
      for (int64_t x = 0; x < E; ++x) {
        const int64_t off = count_[static_cast<size_t>(x)], m = count_[static_cast<size_t>(x) + 1] - off;
        if (m == 0) continue;
        const DevFfn& f = D.experts[static_cast<size_t>(x)];
        AFD_RETURN_IF_ERROR(gemm(f.gu, 2 * f.inter, hid, d_xs_.p + off * hid, m, d_gu_.p + off * 2 * f.inter));
      }
      AFD_CUDA_TRY(kc::silu_mul_bf16(d_gu_.p, M, inter, d_act_.p, stream_));
      for (int64_t x = 0; x < E; ++x) {
        const int64_t off = count_[static_cast<size_t>(x)], m = count_[static_cast<size_t>(x) + 1] - off;
        if (m == 0) continue;
        const DevFfn& f = D.experts[static_cast<size_t>(x)];
        AFD_RETURN_IF_ERROR(gemm(f.down, hid, f.inter, d_act_.p + off * f.inter, m, d_y_.p + off * hid));
      }
    }
    AFD_CUDA_TRY(kc::scatter_weighted(d_y_.p, M, hid, d_slots_.p, d_w_.p, d_slot_out_.p, stream_));
    AFD_CUDA_TRY(kc::sum_slots(d_slot_out_.p, n, K, hid, d_out_.p, stream_));
  }
  if (D.shared.held() && n > 0) {
    AFD_CUDA_TRY(kc::gather_rows_bf16(d_h_.p, hid, nullptr, n, d_xs_.p, stream_));
    AFD_RETURN_IF_ERROR(swiglu(D.shared, n, d_xs_.p, d_y_.p));
    AFD_CUDA_TRY(kc::add_gated(d_h_.p, D.moe ? D.shared_gate : nullptr, d_y_.p, n, hid, d_out_.p, stream_));
  }
  if (n > 0) AFD_CUDA_TRY(cudaMemcpyAsync(S.out.p, d_out_.p, hbytes, cudaMemcpyDeviceToHost, stream_));
  AFD_CUDA_TRY(cudaEventRecord(S.done, stream_));
  S.n = n;
  return Status();
}

Status CudaFfnImpl::collect(int slot, float* out, double* gpu_ms) {
  if (!broken_.is_ok()) return broken_;
  if (slot < 0 || slot >= static_cast<int>(slots_.size()) || slots_[static_cast<size_t>(slot)].n < 0)
    return invalid_argument("CUDA FFN: collect on slot " + std::to_string(slot) + " with nothing submitted");
  Slot& S = slots_[static_cast<size_t>(slot)];
  AFD_CUDA_TRY(cudaEventSynchronize(S.done));
  const int64_t n = S.n;
  S.n = -1;
  std::memcpy(out, S.out.p, static_cast<size_t>(n * w_->config.hidden_size) * sizeof(float));
  if (gpu_ms != nullptr) {
    float ms = 0;
    AFD_CUDA_TRY(cudaEventElapsedTime(&ms, S.start, S.done));
    *gpu_ms = ms;
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<CudaFfn>> CudaFfn::create(std::shared_ptr<const ModelWeights> w, const CudaFfnOptions& opt) {
  if (!w) return invalid_argument("CUDA FFN: no model");
  auto impl = std::make_unique<CudaFfnImpl>();
  AFD_RETURN_IF_ERROR(impl->init(std::move(w), opt));
  return std::unique_ptr<CudaFfn>(std::move(impl));
}

bool cuda_ffn_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    if (why != nullptr) *why = e != cudaSuccess ? cuda_error("no usable GPU", e) : "no GPU visible";
    return false;
  }
  return true;
}

}  // namespace afd
