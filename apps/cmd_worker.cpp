// afd worker: one worker process of a multi-process / multi-host AFD deployment
// (docs/DEPLOYMENT.md). Workers start in any order and wait for their peers.
//   --role ffn        FFN worker over UCX: accepts the attention workers (`--attention x` at start,
//                     and any that join later with an index it does not serve yet) on
//                     --listen and serves expert shard --shard i/y until SIGINT/SIGTERM,
//                     surviving peers that die or misbehave. --ffn-tp t: TP rank i % t of EP
//                     group i / t (runtime/topology.h).
//   --role attention  attention worker: the whole serving stack of `afd serve` (scheduler,
//                     engine with KV cache, sampling) with remote FFN workers (--ffn, in shard
//                     order; --attention-index i of --attention x), answering the HTTP API on
//                     --listen for a front end (`afd serve --attention-workers|--topology-file`).
//   --topology-file F --role R --index i   takes its settings from F (environment mirrors and
//                     flags override them: apps/deployment_config.h); --print-config prints
//                     the effective settings and their sources and exits.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "commands.h"
#include "comm/ucx_transport.h"
#include "core/log.h"
#include "core/timer.h"
#include "deployment_config.h"
#include "engine_flags.h"
#include "model/weights.h"
#include "runtime/afd/ffn_worker.h"
#include "runtime/trace.h"
#include "runtime/topology.h"
#include "runtime/topology_file.h"
#include "serve/metrics/ffn_metrics.h"
#include "serve_stack.h"
#include "trace_output.h"

namespace afd::cli {

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }

struct WorkerFlags {
  std::string role = "ffn";
  EngineFlags engine;
  ServiceFlags service;
  std::string listen;  // default: 127.0.0.1:7100 for ffn; required for attention
  std::string shard = "0/1";
  int n_attention = 1;
  int peer_timeout_ms = FfnWorkerOptions{}.peer_timeout_ms;
  std::string topology_file;
  int index = -1;
  std::string metrics_listen;  // FFN: host:port for GET /metrics and /health; empty: none
  bool print_config = false;
};

// An FFN worker's settings: its shard i/y and precision, or why they are invalid.
Status check_ffn(const WorkerFlags& f, int* shard, int* n_shards, Precision* prec) {
  AFD_RETURN_IF_ERROR(parse_shard(f.shard, shard, n_shards));
  if (!precision_from_name(f.engine.precision, prec)) return invalid_argument("--precision: reference | fast");
  if (f.n_attention < 1 || f.n_attention > 64) return invalid_argument("--attention must be in [1, 64]");
  AFD_RETURN_IF_ERROR(f.engine.options.validate_ffn_device());
  if (f.engine.options.afd.ffn_tp < 1 || *n_shards % f.engine.options.afd.ffn_tp != 0)
    return invalid_argument("--ffn-tp " + std::to_string(f.engine.options.afd.ffn_tp) + " does not divide the " +
                            std::to_string(*n_shards) + " FFN workers of --shard " + f.shard);
  return Status();
}

void run_ffn(const WorkerFlags& f) {
  const std::string listen = f.listen.empty() ? "127.0.0.1:7100" : f.listen;
  int shard = 0, n_shards = 1;
  Precision prec;
  Status s = check_ffn(f, &shard, &n_shards, &prec);
  if (!s.is_ok()) fail("worker", s);
  auto w = load_model(f.engine.options.model_dir);
  if (!w.ok()) fail("worker", w.status());

  comm::UcxOptions uo;
  uo.name = "ffn" + std::to_string(shard);
  uo.set_waiter_spin_us(f.engine.options.afd.ucx_spin_us);
  auto t = comm::UcxTransport::create(uo);
  if (!t.ok()) fail("worker", t.status());
  s = (*t)->listen(listen);
  if (!s.is_ok()) fail("worker", s);
  FfnWorkerOptions fo;
  fo.index = shard;
  fo.n_ffn = n_shards;
  fo.n_attention = f.n_attention;
  fo.prec = prec == Precision::reference ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
  fo.batch_invariant = batch_invariant_kernels(f.engine.options.deterministic, prec);
  fo.peer_timeout_ms = f.peer_timeout_ms;
  fo.tp = f.engine.options.afd.ffn_tp;
  fo.device = f.engine.options.ffn_device;
  if (const std::string& file = f.engine.options.emulation.stage_costs_file; !file.empty()) {
    auto e = StageCostEmulation::open(file);
    if (!e.ok()) fail("worker", e.status());
    fo.emulation = std::move(*e);
  }
  // --trace: this worker's batches on the FFN lane of the bundle's timeline.
  std::shared_ptr<TraceRecorder> trace;
  if (!f.engine.trace.empty()) {
    trace = std::make_shared<TraceRecorder>(static_cast<size_t>(f.engine.trace_max_spans));
    if (Status ts = trace->stream_to(f.engine.trace); !ts.is_ok()) fail("worker", ts.with_context("--trace"));
    trace_ffn_batches(trace, &fo);
  }
  ThreadPool pool(f.engine.options.n_threads);
  auto worker = FfnWorker::create(*w, t->get(), fo, &pool);
  if (!worker.ok()) fail("worker", worker.status());
  std::unique_ptr<serve::StatusServer> status;
  if (!f.metrics_listen.empty()) {
    serve::ServerOptions so;
    if (Status hs = split_host_port(f.metrics_listen, &so.host, &so.port); !hs.is_ok())
      fail("worker", hs.with_context("--metrics-listen"));
    so.http_threads = 4;
    const serve::FfnWorkerSample sample = serve::ffn_worker_sample(**worker);
    auto st = serve::StatusServer::start(
        so, [sample] { return serve::render_ffn_worker_metrics({&sample, 1}, now_ns()); },
        [sample, deterministic = fo.batch_invariant && fo.device != "cuda"] {
          // tokens / expert_rows: the worker's counters for `afd bench --spawn-ffn`.
          return std::make_pair(200, "{\"status\":\"ok\",\"role\":\"ffn\",\"deterministic\":" +
                                         std::string(deterministic ? "true" : "false") + ",\"attention_serving\":" +
                                         std::to_string(sample.stats->attention_serving.load()) +
                                         ",\"attention_expected\":" + std::to_string(sample.info.n_attention) +
                                         ",\"tokens\":" + std::to_string(sample.stats->tokens.load()) +
                                         ",\"expert_rows\":" + std::to_string(sample.stats->expert_rows.load()) + "}");
        });
    if (!st.ok()) fail("worker", st.status().with_context("--metrics-listen"));
    status = std::move(*st);
    spdlog::info("ffn worker {}: metrics on http://{}:{}/metrics", shard, so.host, status->port());
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  spdlog::info("ffn worker {}/{} (FFN TP degree {}) listening on {} for {} attention worker(s)", shard, n_shards,
               f.engine.options.afd.ffn_tp, listen, f.n_attention);
  s = (*worker)->run(&g_stop);
  status.reset();
  (*t)->close();
  if (trace) {
    if (Status ts = write_trace("worker", *trace, f.engine.trace); !ts.is_ok())
      spdlog::error("afd worker: {}", ts.to_string());
  }
  if (!s.is_ok()) fail("worker", s);
  const auto& st = (*worker)->stats();
  spdlog::info("ffn worker {} stopped: {} batches, {} tokens, {} bad frames", shard, st.batches.load(),
               st.tokens.load(), st.bad_frames.load());
}

// An attention worker's engine options (f->service gets --listen's host and port, and
// f->engine.topology the bundle's), or why its settings are invalid. open_trace: start the
// --trace file (EngineFlags::to_options).
Result<EngineOptions> attention_options(WorkerFlags* f, bool open_trace) {
  if (f->engine.ffn.empty())
    return invalid_argument("--role attention needs --ffn host:port,... (the FFN workers, in shard order)");
  if (f->engine.spawn_ffn) return invalid_argument("--spawn-ffn is for afd serve|generate, not a worker");
  if (f->listen.empty()) return invalid_argument("--role attention needs --listen host:port (its HTTP address)");
  if (f->n_attention < 1 || f->n_attention > 64) return invalid_argument("--attention must be in [1, 64]");
  serve::ServerOptions& server = f->service.options.server;
  AFD_RETURN_IF_ERROR(split_host_port(f->listen, &server.host, &server.port).with_context("--listen"));
  AFD_RETURN_IF_ERROR(f->service.validate());
  // The bundle's topology: --topology if given, else --attention x and the --ffn list.
  if (f->engine.topology == "mono") {
    const size_t y = std::count(f->engine.ffn.begin(), f->engine.ffn.end(), ',') + 1;
    f->engine.topology = std::to_string(f->n_attention) + "A" + std::to_string(y) + "F";
  }
  AFD_ASSIGN_OR_RETURN(EngineOptions opt, f->engine.to_options(open_trace));
  const Topology& topo = opt.topology;
  if (opt.afd.attention_index < 0 || opt.afd.attention_index >= topo.n_attention)
    return invalid_argument("--attention-index " + std::to_string(opt.afd.attention_index) + " is outside [0, " +
                            std::to_string(topo.n_attention) + ") of topology " + f->engine.topology);
  return opt;
}

void run_attention(WorkerFlags f) {
  auto opt = attention_options(&f, /*open_trace=*/true);
  if (!opt.ok()) fail("worker", opt.status());
  const Topology& topo = opt->topology;
  spdlog::info("attention worker {}/{}: waiting for FFN workers {}, then serving on {}", opt->afd.attention_index,
               topo.n_attention, f.engine.ffn, f.listen);
  ServiceExtras extras;
  extras.trace_path = f.engine.trace;
  run_engine_service("worker", f.service, *opt,
                     "afd worker: attention worker " + std::to_string(opt->afd.attention_index) + "/" +
                         std::to_string(topo.n_attention) + " serving model '{model}'",
                     "", extras);
}

// The topology file's settings for worker (--role, --index), as layer 2 of cfg (flags and
// environment mirrors win).
Status apply_topology_file(const WorkerFlags& f, DeploymentConfig* cfg) {
  AFD_ASSIGN_OR_RETURN(TopologyFile t, load_topology_file(f.topology_file));
  const bool attention = f.role == "attention";
  const size_t n = attention ? t.attention.size() : t.ffn.size();
  if (f.index < 0 || static_cast<size_t>(f.index) >= n)
    return invalid_argument("--index " + std::to_string(f.index) + ": " + f.topology_file + " has " +
                            std::to_string(n) + " " + f.role + " worker(s)");
  return cfg->apply(t.worker_settings(attention, static_cast<size_t>(f.index)), f.topology_file);
}

// f: the flags CLI11 filled (the topology file's values are written into them too).
void run_worker(WorkerFlags* fp, CLI::App* cmd) {
  if (fp->role != "ffn" && fp->role != "attention")
    fail("worker", invalid_argument("--role '" + fp->role + "': ffn | attention"));
  DeploymentConfig cfg = DeploymentConfig::of(cmd);
  if (!fp->topology_file.empty()) {
    if (Status s = apply_topology_file(*fp, &cfg); !s.is_ok()) fail("worker", s);
  } else if (fp->index >= 0) {
    fail("worker", invalid_argument("--index is for --topology-file"));
  }
  WorkerFlags f = *fp;
  if (f.engine.options.model_dir.empty())
    fail("worker", invalid_argument("--model DIR is required (or --topology-file)"));
  if (f.role == "attention" && !f.metrics_listen.empty())
    fail("worker",
         invalid_argument("--metrics-listen is for --role ffn; an attention worker serves /metrics on --listen"));
  // The one validation of the merged settings, before anything starts (errors name the flags
  // and where their values came from).
  Status valid;
  if (f.role == "ffn") {
    int shard = 0, n_shards = 1;
    Precision prec;
    valid = check_ffn(f, &shard, &n_shards, &prec);
  } else {
    WorkerFlags copy = f;
    valid = attention_options(&copy, /*open_trace=*/false).status();
  }
  if (!valid.is_ok()) fail("worker", cfg.with_sources(valid));
  if (f.print_config) {
    std::printf("%s\n", cfg.to_json().dump(2).c_str());
    return;
  }
  if (f.role == "ffn") run_ffn(f);
  else run_attention(std::move(f));
}

}  // namespace

void register_worker(CLI::App& app) {
  auto f = std::make_shared<WorkerFlags>();
  auto* cmd = app.add_subcommand("worker", "Run one FFN or attention worker process of an AFD deployment");
  add_print_config(cmd, &f->print_config);
  auto* role_opt = cmd->add_option("--role", f->role, "ffn | attention")->envname("AFD_ROLE");
  f->engine.add_to(cmd, /*model_required=*/false);
  f->service.add_to(cmd, /*public_api=*/false);
  cmd->add_option("--listen", f->listen,
                  "host:port to bind: FFN workers accept attention workers there (default 127.0.0.1:7100); "
                  "attention workers answer HTTP there")
      ->envname("AFD_LISTEN");
  cmd->add_option(
         "--shard", f->shard,
         "FFN: this worker's shard i/y (experts [i*E/y, (i+1)*E/y); with --ffn-tp t: TP rank i%t of EP group i/t)")
      ->envname("AFD_SHARD");
  cmd->add_option("--attention", f->n_attention,
                  "Attention workers in the deployment at start (x of xAyF): an FFN worker waits for them and "
                  "serves more that join later; an attention worker's --attention-index is below it")
      ->envname("AFD_N_ATTENTION");
  cmd->add_option("--peer-timeout-ms", f->peer_timeout_ms, "FFN: wait for a mid-step attention worker this long")
      ->envname("AFD_PEER_TIMEOUT_MS");
  auto* file_opt =
      cmd->add_option("--topology-file", f->topology_file,
                      "Take the settings of worker --index of --role from this JSON file (docs/DEPLOYMENT.md); "
                      "flags and AFD_* variables override its values")
          ->envname("AFD_TOPOLOGY_FILE");
  cmd->add_option("--metrics-listen", f->metrics_listen,
                  "FFN: host:port answering GET /metrics (Prometheus) and GET /health (default: none)")
      ->envname("AFD_METRICS_LISTEN");
  auto* index_opt = cmd->add_option("--index", f->index, "With --topology-file: which worker of --role this process is")
                        ->envname("AFD_INDEX");
  // With a file, which worker this is must be said, not defaulted (a missing --role made an
  // FFN worker of an attention worker's command line).
  file_opt->needs(role_opt);
  file_opt->needs(index_opt);
  index_opt->needs(file_opt);
  cmd->callback([f, cmd] { run_worker(f.get(), cmd); });
}

}  // namespace afd::cli
