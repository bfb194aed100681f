#include "local_ffn.h"

#include "core/log.h"
#include "runtime/topology.h"
#include "trace_output.h"

namespace afd::cli {

Result<SpawnedFfnWorker> spawn_ffn_worker(ChildProcesses* children, int index, int n_ffn, int n_attention,
                                          const EngineFlags& e, int threads, bool with_metrics) {
  SpawnedFfnWorker out;
  AFD_ASSIGN_OR_RETURN(int port, children->reserve_port());
  out.address = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> args = {"worker", "--role", "ffn", "--model", e.options.model_dir, "--listen", out.address,
                                   "--shard", std::to_string(index) + "/" + std::to_string(n_ffn),
                                   "--attention", std::to_string(n_attention), "--precision", e.precision,
                                   "--ffn-device", e.options.ffn_device, "--peer-timeout-ms",
                                   std::to_string(e.ffn_peer_timeout_ms)};
  if (e.options.deterministic) args.push_back("--deterministic");
  if (!e.options.emulation.stage_costs_file.empty())
    args.insert(args.end(), {"--emulate-stage-costs", e.options.emulation.stage_costs_file});
  if (e.options.afd.ffn_tp > 1) {
    args.push_back("--ffn-tp");
    args.push_back(std::to_string(e.options.afd.ffn_tp));
  }
  if (threads > 0) {
    args.push_back("--threads");
    args.push_back(std::to_string(threads));
  }
  if (e.options.afd.ucx_spin_us >= 0) {
    args.push_back("--ucx-spin-us");
    args.push_back(std::to_string(e.options.afd.ucx_spin_us));
  }
  if (!e.trace.empty()) {
    out.trace_part = trace_part_path(e.trace, "ffn", index);
    args.insert(args.end(), {"--trace", out.trace_part, "--trace-max-spans", std::to_string(e.trace_max_spans)});
  }
  std::string metrics;
  if (with_metrics) {
    AFD_ASSIGN_OR_RETURN(int mport, children->reserve_port());
    out.metrics = {"127.0.0.1", mport, ""};  // its samples carry ffn="<shard>"
    metrics = out.metrics.address();
    args.insert(args.end(), {"--metrics-listen", metrics});
  }
  out.name = "FFN worker " + std::to_string(index) + "/" + std::to_string(n_ffn);
  AFD_ASSIGN_OR_RETURN(pid_t pid, children->spawn_self(args, out.name));
  spdlog::info("started {} as process {} on {}{}", out.name, pid, out.address,
               metrics.empty() ? "" : ", metrics on " + metrics);
  return out;
}

Result<SpawnedFfn> spawn_ffn_workers(ChildProcesses* children, int n_attention, int n_ffn, const EngineFlags& e,
                                     int threads, bool with_metrics) {
  SpawnedFfn out;
  for (int j = 0; j < n_ffn; ++j) {
    AFD_ASSIGN_OR_RETURN(SpawnedFfnWorker w,
                         spawn_ffn_worker(children, j, n_ffn, n_attention, e, threads, with_metrics));
    out.addresses.push_back(w.address);
    if (with_metrics) out.metrics.push_back(w.metrics);
    if (!w.trace_part.empty()) out.trace_parts.push_back(w.trace_part);
    out.names.push_back(w.name);
  }
  return out;
}

Status LocalFfnProcesses::start(const EngineFlags& flags, EngineOptions* o, bool with_metrics) {
  if (!flags.spawn_ffn) return Status();
  if (!o->afd.ffn_addresses.empty()) return invalid_argument("--spawn-ffn and --ffn exclude each other");
  const Topology& t = o->topology;
  if (t.wiring != Wiring::afd) return invalid_argument("--spawn-ffn needs an xAyF topology, got '" + t.to_string() + "'");
  AFD_ASSIGN_OR_RETURN(SpawnedFfn spawned,
                       spawn_ffn_workers(&children_, t.n_attention, t.n_ffn, flags, flags.options.n_threads, with_metrics));
  o->afd.ffn_addresses = std::move(spawned.addresses);
  metrics_ = std::move(spawned.metrics);
  trace_parts_ = std::move(spawned.trace_parts);
  o->afd.attention_index = 0;
  o->afd.local_attention = t.n_attention;
  return Status();
}

Status LocalFfnProcesses::merge_traces(const char* cmd, const std::string& path) {
  if (trace_parts_.empty()) return Status();
  children_.stop_all();
  return merge_trace_parts(cmd, path, trace_parts_, /*include_path=*/true);
}

}  // namespace afd::cli
