// make_engine: builds an Engine for loaded weights and a wiring.
#pragma once

#include <memory>

#include "runtime/engine.h"
#include "runtime/engine_options.h"

namespace afd {

struct ModelWeights;

// Builds the engine of opt.topology over `weights` (loaded by the caller: load_model; null is
// an invalid_argument). Mono: one PipelineEngine (make_pipeline_engine) over a local or CUDA
// FFN backend; AFD and EP topologies: a DataParallelEngine over the Bundle's attention engines.
Result<std::unique_ptr<Engine>> make_engine(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights);

}  // namespace afd
