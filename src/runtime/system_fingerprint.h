// system_fingerprint: the OpenAI `system_fingerprint` of a serving process, "fp_" and 16 hex
// digits. It changes when anything that can change the numbers of an answer changes: the
// weights (model_fingerprint), the precision, the KV cache dtype, the kernel ISA level the
// process dispatches to, batch invariance (EngineOptions::batch_invariant(): --deterministic,
// or reference precision) and the engine version. Two processes with equal fingerprints give
// equal answers when batch-invariant.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/engine_options.h"

namespace afd {

struct ModelWeights;

std::string system_fingerprint(uint64_t model_fp, const EngineOptions& opt);
// The same from the loaded weights (model_fingerprint(w)).
std::string system_fingerprint(const ModelWeights& w, const EngineOptions& opt);

}  // namespace afd
