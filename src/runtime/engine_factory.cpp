#include "runtime/engine_factory.h"

#include "model/ffn_part.h"
#include "model/weights.h"
#include "runtime/bundle.h"
#include "runtime/cuda_ffn.h"
#include "runtime/pipeline_engine.h"

namespace afd {

namespace {

// What every wiring checks before building.
Status check_engine_inputs(const EngineOptions& opt, const ModelWeights* weights) {
  if (!weights) return invalid_argument("make_engine needs loaded weights (load_model)");
  AFD_RETURN_IF_ERROR(opt.validate());
  const ModelConfig& c = weights->config;
  if (opt.afd.fp8_group > 0 && c.hidden_size % opt.afd.fp8_group != 0)
    return invalid_argument("fp8 group " + std::to_string(opt.afd.fp8_group) + " does not divide hidden_size " +
                            std::to_string(c.hidden_size));
  return check_ffn_tp_degree(*weights, opt.afd.ffn_tp);
}

}  // namespace

Result<std::unique_ptr<DataParallelEngine>> make_afd_engine(const EngineOptions& opt,
                                                            std::shared_ptr<const ModelWeights> weights) {
  AFD_RETURN_IF_ERROR(check_engine_inputs(opt, weights.get()));
  if (opt.topology.wiring == Wiring::mono) return invalid_argument("make_afd_engine: the mono wiring has no bundle");
  AFD_ASSIGN_OR_RETURN(auto bundle, Bundle::create(opt, weights));
  return std::make_unique<DataParallelEngine>(std::move(bundle));
}

Result<std::unique_ptr<Engine>> make_engine(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights) {
  if (opt.topology.wiring != Wiring::mono) {
    AFD_ASSIGN_OR_RETURN(auto e, make_afd_engine(opt, std::move(weights)));
    return std::unique_ptr<Engine>(std::move(e));
  }
  AFD_RETURN_IF_ERROR(check_engine_inputs(opt, weights.get()));
  const ModelConfig& c = weights->config;
  auto pool = std::make_shared<ThreadPool>(opt.n_threads);
  if (opt.ffn_device == "cuda") {
    AFD_ASSIGN_OR_RETURN(auto gpu, CudaFfn::create(weights, CudaFfnOptions{}));
    auto ffn = std::make_unique<CudaFfnBackend>(std::move(gpu), c.hidden_size, opt.emulation.fp8_dispatch, opt.afd.fp8_group);
    return make_pipeline_engine(opt, weights, std::move(ffn), pool);
  }
  LocalFfnOptions fo;
  fo.part.prec = opt.precision == Precision::reference ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
  fo.part.order = kernels::linear_order(opt.batch_invariant());
  fo.fp8_dispatch = opt.emulation.fp8_dispatch || opt.emulation.afd_rounding_shards > 0;
  fo.fp8_group = opt.afd.fp8_group;
  fo.combine_shards = opt.emulation.afd_rounding_shards;
  fo.combine_tp = opt.afd.ffn_tp;
  for (int r = 0; opt.afd.ffn_tp > 1 && r < opt.afd.ffn_tp; ++r) {
    FfnTpSlice sl;
    sl.rank = r;
    sl.degree = opt.afd.ffn_tp;
    AFD_ASSIGN_OR_RETURN(auto ws, slice_ffn_tp(weights, sl));
    fo.tp_slices.push_back(std::move(ws));
  }
  return make_pipeline_engine(opt, weights, std::make_unique<LocalFfnBackend>(weights, fo, pool.get()), pool);
}

}  // namespace afd
