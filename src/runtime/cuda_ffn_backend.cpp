#include "core/timer.h"
#include "runtime/cuda_ffn.h"

namespace afd {

Status CudaFfn::run(int64_t layer, const float* h, int64_t n, const int32_t* ids, const float* weights, float* out) {
  AFD_RETURN_IF_ERROR(submit(0, layer, h, n, ids, weights));
  return collect(0, out);
}

CudaFfnBackend::CudaFfnBackend(std::unique_ptr<CudaFfn> gpu, int64_t hidden, bool fp8_dispatch, int64_t fp8_group)
    : gpu_(std::move(gpu)), hidden_(hidden), fp8_dispatch_(fp8_dispatch), fp8_group_(fp8_group) {}

Status CudaFfnBackend::dispatch(int64_t layer, int microbatch, TokenBatch& b) {
  const int64_t t0 = now_ns();
  const float* h = b.h.data();
  if (fp8_dispatch_) {
    hq_.assign(b.h.begin(), b.h.begin() + b.n * hidden_);
    fp8_round_trip(hq_.data(), b.n, hidden_, fp8_group_, &q8_, &scales_);
    h = hq_.data();
  }
  const bool moe = !b.topk_ids.empty();
  Status s = gpu_->submit(microbatch, layer, h, b.n, moe ? b.topk_ids.data() : nullptr,
                          moe ? b.topk_w.data() : nullptr);
  times_at(layer).a2f_s += (now_ns() - t0) * 1e-9;
  return s;
}

Status CudaFfnBackend::combine(int64_t layer, int microbatch, TokenBatch& b) {
  const int64_t t0 = now_ns();
  double gpu_ms = 0;
  Status s = gpu_->collect(microbatch, b.ffn_out.data(), &gpu_ms);
  FfnLayerTimes& t = times_at(layer);
  t.ffn_s += gpu_ms * 1e-3;
  t.f2a_s += (now_ns() - t0) * 1e-9;
  return s;
}

}  // namespace afd
