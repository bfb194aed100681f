#include "runtime/engine_factory.h"

#include <algorithm>

#include "model/attention_variant.h"
#include "model/ffn_part.h"
#include "model/weights.h"
#include "runtime/bundle.h"
#include "runtime/cuda_ffn.h"
#include "runtime/pipeline_engine.h"
#include "runtime/topology.h"

namespace afd {

bool precision_from_name(const std::string& s, Precision* out) {
  if (s == "reference") { *out = Precision::reference; return true; }
  if (s == "fast") { *out = Precision::fast; return true; }
  return false;
}

int EngineOptions::pipeline_microbatches() const {
  if (microbatches > 0) return microbatches;
  Result<Topology> t = parse_topology(topology);
  return t.ok() && t->wiring == Wiring::afd ? 3 : 1;
}

Status EngineOptions::validate() const {
  if (kv.block_size <= 0 || kv.block_size > 1024)
    return invalid_argument("kv block size must be in [1, 1024], got " + std::to_string(kv.block_size));
  if (kv.capacity_tokens < 0) return invalid_argument("kv capacity must be >= 0");
  if (kv.max_seqs <= 0) return invalid_argument("max sequences must be positive");
  if (microbatches < 0 || microbatches > 4)
    return invalid_argument("micro-batches must be in [1, 4] (0: the wiring's default), got " +
                            std::to_string(microbatches));
  if (kv.dtype != DType::f32 && kv.dtype != DType::bf16 && kv.dtype != DType::f8_e4m3)
    return invalid_argument("kv dtype must be f32, bf16 or fp8");
  if (afd.fp8_group < 0) return invalid_argument("fp8 group must be >= 0");
  if (emulation.afd_rounding_shards < 0 || emulation.afd_rounding_shards > 64)
    return invalid_argument("AFD rounding shards must be in [0, 64]");
  AFD_ASSIGN_OR_RETURN(Topology t, parse_topology(topology));
  if (t.wiring == Wiring::mono && !afd.ffn_addresses.empty())
    return invalid_argument("remote FFN addresses need an AFD topology (e.g. 1A" +
                            std::to_string(afd.ffn_addresses.size()) + "F)");
  if (!afd.ffn_addresses.empty() && static_cast<int>(afd.ffn_addresses.size()) != t.n_ffn)
    return invalid_argument("topology " + t.to_string() + " has " + std::to_string(t.n_ffn) + " FFN workers but " +
                            std::to_string(afd.ffn_addresses.size()) + " addresses were given");
  if (afd.attention_index < 0 || afd.attention_index >= t.n_attention)
    return invalid_argument("attention index " + std::to_string(afd.attention_index) + " is outside [0, " +
                            std::to_string(t.n_attention) + ")");
  if (afd.max_batch_tokens < 1) return invalid_argument("max batch tokens must be positive");
  if (emulation.inject_delay_us < 0 || emulation.inject_delay_us > 10000000) return invalid_argument("injected delay must be in [0, 10 s]");
  if (emulation.inject_delay_us > 0 && t.wiring == Wiring::mono)
    return invalid_argument("an injected A<->F delay needs an AFD topology (mono has no messages)");
  if (afd.ffn_timeout_ms < 1) return invalid_argument("ffn timeout must be positive");
  if (afd.ffn_probe_ms < 0) return invalid_argument("ffn probe interval must be >= 0 (0: no probes)");
  if (afd.ffn_takeover_ms < 0) return invalid_argument("ffn takeover time must be >= 0 (0: never)");
  if (afd.ffn_parts < 0 || afd.ffn_parts > 64) return invalid_argument("--ffn-parts must be in [0, 64] (0: y)");
  if (afd.ffn_parts > 0 && afd.ffn_tp > 1)
    return invalid_argument("--ffn-parts needs whole experts; FFN workers with --ffn-tp > 1 keep their shards");
  if (afd.ucx_spin_us < -1 || afd.ucx_spin_us > 1000000) return invalid_argument("--ucx-spin-us must be in [-1, 1000000]");
  if (t.wiring != Wiring::mono && afd.fp8_group != 0 && afd.fp8_group != 128)
    return invalid_argument("the AFD wire carries per-token (--fp8-group 0) or per-128-channel scales, not " +
                            std::to_string(afd.fp8_group));
  if (t.wiring != Wiring::mono && emulation.afd_rounding_shards > 0)
    return invalid_argument("--afd-rounding emulates an AFD bundle in the monolithic engine; use it with mono");
  if (afd.local_attention < 1) return invalid_argument("local attention workers must be >= 1");
  if (ffn_device != "cpu" && ffn_device != "cuda")
    return invalid_argument("--ffn-device must be cpu or cuda, got '" + ffn_device + "'");
  if (ffn_device == "cuda" && emulation.afd_rounding_shards > 0)
    return invalid_argument("--afd-rounding reproduces the CPU bundle's rounding; use it with --ffn-device cpu");
  if (afd.ffn_tp < 1 || afd.ffn_tp > 64) return invalid_argument("--ffn-tp must be in [1, 64], got " + std::to_string(afd.ffn_tp));
  if (afd.ffn_tp > 1) {
    if (t.wiring == Wiring::ep) return invalid_argument("--ffn-tp applies to xAyF topologies, not " + t.to_string());
    if (t.wiring == Wiring::mono && emulation.afd_rounding_shards == 0)
      return invalid_argument("--ffn-tp with mono needs --afd-rounding y (the bundle whose rounding to reproduce)");
    const int y = t.wiring == Wiring::mono ? emulation.afd_rounding_shards : t.n_ffn;
    if (y % afd.ffn_tp != 0)
      return invalid_argument("--ffn-tp " + std::to_string(afd.ffn_tp) + " does not divide the " + std::to_string(y) +
                              " FFN workers" + (t.wiring == Wiring::mono ? " of --afd-rounding" : " of " + t.to_string()));
  }
  return Status::ok();
}

Result<std::unique_ptr<Engine>> make_engine(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights) {
  AFD_RETURN_IF_ERROR(opt.validate());
  if (!weights) {
    AFD_ASSIGN_OR_RETURN(weights, load_model(opt.model_dir));
  }
  const ModelConfig& c = weights->config;
  if (opt.afd.fp8_group > 0 && c.hidden_size % opt.afd.fp8_group != 0)
    return invalid_argument("fp8 group " + std::to_string(opt.afd.fp8_group) + " does not divide hidden_size " +
                            std::to_string(c.hidden_size));
  AFD_ASSIGN_OR_RETURN(Topology topo, parse_topology(opt.topology));
  topo.ffn_tp = opt.afd.ffn_tp;
  AFD_RETURN_IF_ERROR(check_ffn_tp_degree(*weights, opt.afd.ffn_tp));
  if (topo.wiring != Wiring::mono) {
    AFD_ASSIGN_OR_RETURN(auto bundle, Bundle::create(opt, topo, weights));
    return std::unique_ptr<Engine>(std::make_unique<DataParallelEngine>(std::move(bundle)));
  }
  auto pool = std::make_shared<ThreadPool>(opt.n_threads);
  if (opt.ffn_device == "cuda") {
    AFD_ASSIGN_OR_RETURN(auto gpu, CudaFfn::create(weights, CudaFfnOptions{}));
    auto ffn = std::make_unique<CudaFfnBackend>(std::move(gpu), c.hidden_size, opt.emulation.fp8_dispatch, opt.afd.fp8_group);
    return make_pipeline_engine(opt, weights, std::move(ffn), pool);
  }
  LocalFfnOptions fo;
  fo.part.prec = opt.precision == Precision::reference ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
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

Result<std::unique_ptr<Engine>> make_pipeline_engine(const EngineOptions& opt, std::shared_ptr<const ModelWeights> w,
                                                     std::unique_ptr<FfnBackend> ffn,
                                                     std::shared_ptr<ThreadPool> pool) {
  const ModelConfig& c = w->config;
  const bool ref = opt.precision == Precision::reference;
  KvCacheConfig kc;
  kc.n_layers = c.n_layers;
  const KvLayout kvl = kv_layout(c);
  kc.n_kv_heads = kvl.n_kv_heads;
  kc.head_dim = kvl.k_dim;
  kc.k_only = kvl.v_dim == 0;  // MLA: K-only latent rows (model/attention_variant.h)
  kc.block_size = opt.kv.block_size;
  kc.dtype = ref ? DType::f32 : opt.kv.dtype;
  kc.prefix_caching = opt.kv.prefix_caching;
  int64_t cap = opt.kv.capacity_tokens;
  if (cap == 0) {
    const int64_t max_pos = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
    cap = std::min<int64_t>(opt.kv.max_seqs * max_pos, 131072);
  }
  kc.n_blocks = (cap + kc.block_size - 1) / kc.block_size;
  AFD_ASSIGN_OR_RETURN(auto kv, PagedKvCache::create(kc));
  AttentionOptions ao;
  ao.prec = ref ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
  auto pe = std::make_unique<PipelineEngine>(w, std::move(kv), std::move(ffn), std::move(pool), ao, opt.pipeline_microbatches(),
                                             opt.kv.max_seqs);
  if (opt.observability.trace) {
    const int pid = TraceRecorder::kAttentionPid + opt.afd.attention_index;
    pe->set_trace(opt.observability.trace, pid);
    opt.observability.trace->name_process(pid, "attention " + std::to_string(opt.afd.attention_index));
  }
  return std::unique_ptr<Engine>(std::move(pe));
}

}  // namespace afd
