#include "engine_flags.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace afd::cli {

void EngineFlags::add_to(CLI::App* cmd, bool model_required) {
  auto* m = cmd->add_option("--model", options.model_dir, "Model directory (HF layout)")->envname("AFD_MODEL");
  if (model_required) m->required();
  cmd->add_option("--precision", precision, "reference (f32 activations, f32 KV) | fast (bf16 activations)")
      ->envname("AFD_PRECISION");
  cmd->add_flag("--deterministic", options.deterministic,
                "Batch-invariant inference: a sequence's tokens and logprobs are bit-identical whatever else is "
                "batched with it, the wiring and the threads, in fast precision too (reference precision always is)")
      ->envname("AFD_DETERMINISTIC");
  cmd->add_option("--kv-dtype", kv_dtype, "KV cache type in fast precision: bf16 | fp8")->envname("AFD_KV_DTYPE");
  cmd->add_option("--speculative", speculative,
                  "Speculative decoding: none | ngram (prompt lookup, any model) | mtp (DeepSeek's MTP module)")
      ->envname("AFD_SPECULATIVE");
  cmd->add_option("--draft-tokens", options.speculative.draft_tokens,
                  "Drafts per sequence and step: 1..3 with mtp, 1..8 with ngram")
      ->envname("AFD_DRAFT_TOKENS");
  cmd->add_option("--speculative-max-batch", speculative_max_batch,
                  "Propose drafts only in steps with at most this many decoding sequences (0: always; auto: at "
                  "each batch size, whichever of drafting or not decodes more tokens/s, measured while decoding)")
      ->envname("AFD_SPECULATIVE_MAX_BATCH");
  cmd->add_option("--ngram-min", options.speculative.ngram_min, "Shortest n-gram --speculative ngram matches")
      ->envname("AFD_NGRAM_MIN");
  cmd->add_option("--ngram-max", options.speculative.ngram_max, "Longest n-gram --speculative ngram matches")
      ->envname("AFD_NGRAM_MAX");
  cmd->add_option("--kv-capacity", options.kv.capacity_tokens, "KV cache capacity in tokens (0: auto)")
      ->envname("AFD_KV_CAPACITY");
  cmd->add_option("--kv-block", options.kv.block_size, "Tokens per KV block")->envname("AFD_KV_BLOCK");
  cmd->add_option("--max-seqs", options.kv.max_seqs, "Live sequences at most")->envname("AFD_MAX_SEQS");
  cmd->add_flag("--no-prefix-cache", no_prefix_cache,
                "Disable automatic prefix caching (reuse of KV blocks of shared prompt prefixes)")
      ->envname("AFD_NO_PREFIX_CACHE");
  cmd->add_option("--threads", options.n_threads, "Compute threads (0: all cores)")->envname("AFD_THREADS");
  cmd->add_option("--topology", topology, "mono | xAyF (e.g. 2A1F)")->envname("AFD_TOPOLOGY");
  cmd->add_option("--microbatches", microbatches,
                  "Micro-batches per attention worker, 1-4 (default: 3 for xAyF, 1 for mono and EPn)")
      ->envname("AFD_MICROBATCHES");
  cmd->add_flag("--fp8-dispatch", options.emulation.fp8_dispatch, "Round FFN inputs through FP8 as the AFD wire does")
      ->envname("AFD_FP8_DISPATCH");
  cmd->add_option("--afd-rounding", options.emulation.afd_rounding_shards,
                  "Mono: round FP8 dispatch + BF16 combine exactly as an xAyF bundle with this y does")
      ->envname("AFD_AFD_ROUNDING");
  cmd->add_option("--ffn-tp", options.afd.ffn_tp,
                  "FFN tensor-parallel degree t dividing y: y/t EP groups of t ranks, each rank holding I/t of "
                  "every expert (1: pure EP, y: pure TP); mono: with --afd-rounding")
      ->envname("AFD_FFN_TP");
  cmd->add_option("--fp8-group", options.afd.fp8_group, "FP8 scale group: 0 per token, 128 per block")
      ->envname("AFD_FP8_GROUP");
  cmd->add_option("--ffn", ffn, "Remote FFN workers host:port,... (afd worker --role ffn), in shard order")
      ->envname("AFD_FFN");
  cmd->add_option("--attention-index", options.afd.attention_index,
                  "This process's attention worker index (with --ffn)")
      ->envname("AFD_ATTENTION_INDEX");
  cmd->add_option("--ffn-timeout-ms", options.afd.ffn_timeout_ms, "Fail a step whose FFN reply is later than this")
      ->envname("AFD_FFN_TIMEOUT_MS");
  cmd->add_option("--ffn-device", options.ffn_device,
                  "Where the FFN half runs: cpu | cuda (GPU, needs a CUDA build; mono engine and FFN workers)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->envname("AFD_FFN_DEVICE");
  cmd->add_flag("--spawn-ffn", spawn_ffn, "Run the topology's FFN workers as local processes over UCX")
      ->envname("AFD_SPAWN_FFN");
  cmd->add_option("--trace", trace,
                  "Write a Chrome trace-event JSON of the pipeline timeline (Perfetto): streamed to the file as "
                  "the run goes, completed when the command ends (serve, worker: when they stop); a process killed "
                  "mid-run leaves its spans up to then")
      ->envname("AFD_TRACE");
  cmd->add_flag("--eplb", options.afd.eplb,
                "xAyF: the attention side places the routed experts on the FFN workers, replanning every "
                "--eplb-interval-s by EPLB (replicas of hot experts) from its routing counts; outputs do not depend on "
                "the placement (each (token, expert) pair is its own BF16 partial, added in expert order)")
      ->envname("AFD_EPLB");
  cmd->add_option("--eplb-interval-s", options.afd.eplb_interval_s,
                  "--eplb: seconds between placements (0: keep the contiguous one)")
      ->check(CLI::Range(0.0, 86400.0))
      ->envname("AFD_EPLB_INTERVAL_S")
      ->capture_default_str();
  cmd->add_option("--eplb-redundant", options.afd.eplb_redundant,
                  "--eplb: extra expert replicas per layer (rounded up to divide over the FFN workers)")
      ->check(CLI::Range(int64_t{0}, int64_t{65536}))
      ->envname("AFD_EPLB_REDUNDANT")
      ->capture_default_str();
  cmd->add_option("--emulate-stage-costs", options.emulation.stage_costs_file,
                  "Tests and benchmarks: add the attention and FFN costs in this JSON file (re-read when it "
                  "changes) as sleeps inside each stage (runtime/stage_emulation.h; AFD wirings)")
      ->envname("AFD_EMULATE_STAGE_COSTS");
  cmd->add_option("--trace-max-spans", trace_max_spans,
                  "--trace keeps at most this many spans (later ones are dropped)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32))
      ->envname("AFD_TRACE_MAX_SPANS");
  cmd->add_option("--ucx-spin-us", options.afd.ucx_spin_us,
                  "UCX: a thread waiting for a message polls this long before it sleeps (-1: default; "
                  "lower it when workers share few cores)")
      ->check(CLI::Range(-1, 1000000))
      ->envname("AFD_UCX_SPIN_US");
  cmd->add_option("--ffn-connect-timeout-ms", options.afd.ffn_connect_timeout_ms,
                  "Give up waiting for FFN workers after this")
      ->envname("AFD_FFN_CONNECT_TIMEOUT_MS");
  cmd->add_option("--ffn-probe-ms", options.afd.ffn_probe_ms,
                  "Ping idle FFN workers this often; one that leaves a ping unanswered past --ffn-timeout-ms makes "
                  "/health 503 (0: no pings)")
      ->check(CLI::Range(0, 86400000))
      ->envname("AFD_FFN_PROBE_MS");
  cmd->add_option("--ffn-takeover-s", ffn_takeover_s,
                  "An FFN worker unreachable this long (lost, or silent past --ffn-timeout-ms) leaves the expert "
                  "assignment: the other FFN workers take over its experts until it is back (0: never, wait for it; "
                  "not with --ffn-tp > 1)")
      ->check(CLI::Range(0.0, 86400.0))
      ->envname("AFD_FFN_TAKEOVER_S");
  cmd->add_option("--ffn-parts", options.afd.ffn_parts,
                  "Cut the routed experts into this many parts, each rounded on its own: up to this many FFN workers "
                  "share them (more are standbys) and results equal mono --afd-rounding P whoever holds which part "
                  "(0: y of the topology)")
      ->check(CLI::Range(0, 64))
      ->envname("AFD_FFN_PARTS");
}

Result<std::vector<std::string>> parse_address_list(const std::string& flag, const std::string& csv) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= csv.size()) {
    size_t j = csv.find(',', i);
    if (j == std::string::npos) j = csv.size();
    std::string a = csv.substr(i, j - i);
    if (a.empty() || a.find(':') == std::string::npos) return invalid_argument(flag + ": '" + a + "' is not host:port");
    if (std::find(out.begin(), out.end(), a) != out.end())
      return invalid_argument(flag + ": " + a + " is listed twice (one address per worker)");
    out.push_back(std::move(a));
    i = j + 1;
  }
  return out;
}

namespace {
// --kv-dtype's names, both ways (fp8 also as its safetensors-style name f8_e4m3).
constexpr std::pair<const char*, DType> kKvDtypes[] = {
    {"bf16", DType::bf16}, {"fp8", DType::f8_e4m3}, {"f8_e4m3", DType::f8_e4m3}, {"f32", DType::f32}};
}  // namespace

const char* kv_dtype_flag(DType t) {
  for (const auto& [name, d] : kKvDtypes)
    if (d == t) return name;
  return dtype_name(t);
}

Result<EngineOptions> EngineFlags::to_options(bool open_trace) const {
  EngineOptions o = options;
  if (!precision_from_name(precision, &o.precision))
    return invalid_argument("--precision must be 'reference' or 'fast', got '" + precision + "'");
  const auto* kv = std::find_if(std::begin(kKvDtypes), std::end(kKvDtypes),
                                [&](const auto& n) { return kv_dtype == n.first; });
  if (kv == std::end(kKvDtypes))
    return invalid_argument("--kv-dtype must be bf16, fp8 or f32, got '" + kv_dtype + "'");
  o.kv.dtype = kv->second;
  o.kv.prefix_caching = !no_prefix_cache;
  if (!speculative_method_from_name(speculative, &o.speculative.method))
    return invalid_argument("--speculative must be none, ngram or mtp, got '" + speculative + "'");
  if (speculative_max_batch == "auto") {
    o.speculative.max_batch = SpeculativeOptions::kMaxBatchAuto;
  } else {
    auto v = parse_int_list(speculative_max_batch, "--speculative-max-batch");
    if (!v.ok() || v->size() != 1 || (*v)[0] < 0)
      return invalid_argument("--speculative-max-batch must be auto or an integer >= 0, got '" + speculative_max_batch +
                              "'");
    o.speculative.max_batch = (*v)[0];
  }
  if (!microbatches.empty()) {  // empty: EngineOptions::pipeline_microbatches() picks the wiring's default
    auto v = parse_int_list(microbatches, "--microbatches");
    if (!v.ok() || v->size() != 1 || (*v)[0] < 1 || (*v)[0] > 4)
      return invalid_argument("--microbatches: micro-batches must be one value in 1..4, got '" + microbatches + "'");
    o.microbatches = static_cast<int>((*v)[0]);
  }
  std::string wiring = topology;
  if (!ffn.empty()) {
    AFD_ASSIGN_OR_RETURN(o.afd.ffn_addresses, parse_address_list("--ffn", ffn));
    // A bare --ffn list with the default topology means 1A{n}F.
    if (topology == Topology{}.to_string()) wiring = "1A" + std::to_string(o.afd.ffn_addresses.size()) + "F";
  }
  AFD_ASSIGN_OR_RETURN(o.topology, parse_topology(wiring));
  o.afd.ffn_takeover_ms = static_cast<int>(ffn_takeover_s * 1000 + 0.5);
  AFD_RETURN_IF_ERROR(o.validate());
  if (!trace.empty() && open_trace) {
    // Streamed from the start: a process killed mid-run leaves its spans up to then.
    o.observability.trace = std::make_shared<TraceRecorder>(static_cast<size_t>(trace_max_spans));
    AFD_RETURN_IF_ERROR(o.observability.trace->stream_to(trace).with_context("--trace"));
  }
  return o;
}

Result<std::vector<int64_t>> parse_int_list(const std::string& s, const char* what) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    if (tok.empty()) return invalid_argument(std::string(what) + ": empty element in '" + s + "'");
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE)
      return invalid_argument(std::string(what) + ": '" + tok + "' is not an integer");
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

Result<std::vector<int32_t>> parse_id_list(const std::string& s) {
  AFD_ASSIGN_OR_RETURN(auto v, parse_int_list(s, "prompt ids"));
  std::vector<int32_t> out;
  for (int64_t x : v) {
    if (x < 0 || x > INT32_MAX) return out_of_range("prompt ids: " + std::to_string(x) + " is not a valid token id");
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

void fail(const char* cmd, const std::string& message) {
  std::fprintf(stderr, "afd %s: error: %s\n", cmd, message.c_str());
  throw CLI::RuntimeError(1);
}

void fail(const char* cmd, const Status& s) { fail(cmd, s.to_string()); }

}  // namespace afd::cli
