// make_engine: builds an Engine for loaded weights and a wiring.
#pragma once

#include <memory>

#include "runtime/engine.h"
#include "runtime/engine_options.h"

namespace afd {

struct ModelWeights;
class DataParallelEngine;

// Builds the engine of opt.topology over `weights` (loaded by the caller: load_model; null is
// an invalid_argument). Mono: one PipelineEngine (make_pipeline_engine) over a local or CUDA
// FFN backend; AFD and EP topologies: a DataParallelEngine over the Bundle's attention engines.
Result<std::unique_ptr<Engine>> make_engine(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights);
// make_engine for an AFD or EP topology (opt.topology.wiring != mono; invalid_argument for mono),
// typed, for callers that also reach the bundle's FFN workers and clients (metrics, admin).
Result<std::unique_ptr<DataParallelEngine>> make_afd_engine(const EngineOptions& opt,
                                                            std::shared_ptr<const ModelWeights> weights);

}  // namespace afd
