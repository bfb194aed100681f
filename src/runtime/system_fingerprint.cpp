#include "runtime/system_fingerprint.h"

#include <cstdio>

#include "core/hash.h"
#include "kernels/cpu/isa.h"
#include "model/fingerprint.h"

namespace afd {

namespace {
// Bumped when a change of afd alters the numbers it computes for an unchanged configuration.
constexpr uint32_t kNumericsVersion = 2;
}  // namespace

std::string system_fingerprint(uint64_t model_fp, const EngineOptions& opt) {
  uint64_t h = hash64(&model_fp, sizeof model_fp);
  const int32_t fields[] = {static_cast<int32_t>(kNumericsVersion), static_cast<int32_t>(opt.precision),
                            // reference precision always keeps an f32 KV cache
                            opt.precision == Precision::reference ? static_cast<int32_t>(DType::f32)
                                                                  : static_cast<int32_t>(opt.kv.dtype),
                            static_cast<int32_t>(kernels::active_isa()), opt.batch_invariant() ? 1 : 0,
                            opt.ffn_device == "cuda" ? 1 : 0};
  h = hash64(fields, sizeof fields, h);
  char out[24];
  std::snprintf(out, sizeof out, "fp_%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::string system_fingerprint(const ModelWeights& w, const EngineOptions& opt) {
  return system_fingerprint(model_fingerprint(w), opt);
}

}  // namespace afd
