// CudaFfn in a build without CUDA (AFD_CUDA=OFF, or no nvcc found): every request for the
// GPU FFN gets a clear `unavailable` error naming the build option.
#include "runtime/cuda_ffn.h"

namespace afd {

namespace {
constexpr const char* kWhy =
    "this afd was built without the CUDA backend: configure with -DAFD_CUDA=ON on a machine with nvcc and cuBLAS";
}

Result<std::unique_ptr<CudaFfn>> CudaFfn::create(std::shared_ptr<const ModelWeights>, const CudaFfnOptions&) {
  return unavailable(kWhy);
}

bool cuda_ffn_available(std::string* why) {
  if (why != nullptr) *why = kWhy;
  return false;
}

}  // namespace afd
