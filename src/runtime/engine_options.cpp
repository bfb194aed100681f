#include "runtime/engine_options.h"

namespace afd {

bool precision_from_name(const std::string& s, Precision* out) {
  if (s == "reference") { *out = Precision::reference; return true; }
  if (s == "fast") { *out = Precision::fast; return true; }
  return false;
}

const char* precision_name(Precision p) { return p == Precision::reference ? "reference" : "fast"; }

bool speculative_method_from_name(const std::string& s, SpeculativeMethod* out) {
  if (s == "none") { *out = SpeculativeMethod::none; return true; }
  if (s == "ngram") { *out = SpeculativeMethod::ngram; return true; }
  if (s == "mtp") { *out = SpeculativeMethod::mtp; return true; }
  return false;
}

const char* speculative_method_name(SpeculativeMethod m) {
  switch (m) {
    case SpeculativeMethod::ngram: return "ngram";
    case SpeculativeMethod::mtp: return "mtp";
    case SpeculativeMethod::none: break;
  }
  return "none";
}

Status SpeculativeOptions::validate() const {
  // The counts are checked whatever the method, so a wrong flag is not silently ignored.
  const int64_t max_k = method == SpeculativeMethod::mtp ? 3 : 8;
  if (draft_tokens < 1 || draft_tokens > max_k)
    return invalid_argument(std::string("--draft-tokens must be in [1, ") + std::to_string(max_k) + "]" +
                            (method == SpeculativeMethod::none ? std::string()
                                                               : std::string(" for --speculative ") + speculative_method_name(method)) +
                            ", got " + std::to_string(draft_tokens));
  if (max_batch < kMaxBatchAuto)
    return invalid_argument("--speculative-max-batch must be auto or >= 0 (0: no limit)");
  if ((ngram_min < 1 || ngram_min > ngram_max || ngram_max > 16))
    return invalid_argument("--ngram-min / --ngram-max must satisfy 1 <= min <= max <= 16, got " +
                            std::to_string(ngram_min) + " / " + std::to_string(ngram_max));
  return Status();
}

int EngineOptions::pipeline_microbatches() const {
  if (microbatches > 0) return microbatches;
  return topology.wiring == Wiring::afd ? 3 : 1;
}

Status EngineOptions::validate_ffn_device() const {
  if (ffn_device == "cuda" && deterministic)
    return invalid_argument("--deterministic needs the CPU FFN: the CUDA FFN's results depend on the batch "
                            "(use --ffn-device cpu)");
  return Status();
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
  const Topology& t = topology;
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
  if (!emulation.stage_costs_file.empty() && t.wiring == Wiring::mono)
    return invalid_argument("--emulate-stage-costs needs an AFD or EP topology (it slows the attention and FFN "
                            "stages of one)");
  if (emulation.inject_delay_us > 0 && t.wiring == Wiring::mono)
    return invalid_argument("an injected A<->F delay needs an AFD topology (mono has no messages)");
  if (afd.ffn_timeout_ms < 1) return invalid_argument("ffn timeout must be positive");
  if (afd.ffn_probe_ms < 0) return invalid_argument("ffn probe interval must be >= 0 (0: no probes)");
  if (afd.ffn_takeover_ms < 0) return invalid_argument("ffn takeover time must be >= 0 (0: never)");
  if (afd.ffn_parts < 0 || afd.ffn_parts > 64) return invalid_argument("--ffn-parts must be in [0, 64] (0: y)");
  if (afd.eplb && t.wiring != Wiring::afd)
    return invalid_argument("--eplb places experts on the FFN workers of an xAyF topology, got " + t.to_string());
  if (afd.eplb && afd.ffn_tp > 1)
    return invalid_argument("--eplb moves whole experts; FFN workers with --ffn-tp > 1 keep their shards");
  if (afd.eplb_interval_s < 0 || afd.eplb_interval_s > 86400)
    return invalid_argument("--eplb-interval-s must be in [0, 86400] (0: keep the contiguous placement)");
  if (afd.eplb_redundant < 0 || afd.eplb_redundant > 65536)
    return invalid_argument("--eplb-redundant must be in [0, 65536]");
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
  AFD_RETURN_IF_ERROR(validate_ffn_device());
  AFD_RETURN_IF_ERROR(speculative.validate());
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
  return Status();
}

}  // namespace afd
