// afd worker: one worker process of a multi-process / multi-host AFD deployment
// (docs/DEPLOYMENT.md). Workers start in any order and wait for their peers.
//   --role ffn        FFN worker over UCX: accepts the attention workers (`--attention x`) on
//                     --listen and serves expert shard --shard i/y until SIGINT/SIGTERM,
//                     surviving peers that die or misbehave. --ffn-tp t: TP rank i % t of EP
//                     group i / t (runtime/topology.h).
//   --role attention  attention worker: the whole serving stack of `afd serve` (scheduler,
//                     engine with KV cache, sampling) with remote FFN workers (--ffn, in shard
//                     order; --attention-index i of --attention x), answering the HTTP API on
//                     --listen for a front end (`afd serve --attention-workers|--topology-file`).
//   --topology-file F --role R --index i   takes every setting from F.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "commands.h"
#include "comm/ucx_transport.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine_flags.h"
#include "model/weights.h"
#include "runtime/ffn_worker.h"
#include "runtime/trace.h"
#include "runtime/topology.h"
#include "runtime/topology_file.h"
#include "serve/ffn_metrics.h"
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
  int peer_timeout_ms = 10000;
  std::string topology_file;
  int index = -1;
  std::string metrics_listen;  // FFN: host:port for GET /metrics and /health; empty: none
};

void run_ffn(const WorkerFlags& f) {
  const std::string listen = f.listen.empty() ? "127.0.0.1:7100" : f.listen;
  int shard = 0, n_shards = 1;
  Status s = parse_shard(f.shard, &shard, &n_shards);
  if (!s.is_ok()) fail("worker", s);
  Precision prec;
  if (!precision_from_name(f.engine.precision, &prec))
    fail("worker", invalid_argument("--precision: reference | fast"));
  if (f.n_attention < 1 || f.n_attention > 64) fail("worker", invalid_argument("--attention must be in [1, 64]"));
  if (f.engine.ffn_tp < 1 || n_shards % f.engine.ffn_tp != 0)
    fail("worker", invalid_argument("--ffn-tp " + std::to_string(f.engine.ffn_tp) + " does not divide the " +
                                    std::to_string(n_shards) + " FFN workers of --shard " + f.shard));
  auto w = load_model(f.engine.model_dir);
  if (!w.ok()) fail("worker", w.status());

  comm::UcxOptions uo;
  uo.name = "ffn" + std::to_string(shard);
  uo.set_waiter_spin_us(f.engine.ucx_spin_us);
  auto t = comm::UcxTransport::create(uo);
  if (!t.ok()) fail("worker", t.status());
  s = (*t)->listen(listen);
  if (!s.is_ok()) fail("worker", s);
  FfnWorkerOptions fo;
  fo.index = shard;
  fo.n_ffn = n_shards;
  fo.n_attention = f.n_attention;
  fo.prec = prec == Precision::reference ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
  fo.peer_timeout_ms = f.peer_timeout_ms;
  fo.tp = f.engine.ffn_tp;
  fo.device = f.engine.ffn_device;
  // --trace: this worker's batches on the FFN lane of the bundle's timeline.
  std::shared_ptr<TraceRecorder> trace;
  if (!f.engine.trace.empty()) {
    trace = std::make_shared<TraceRecorder>(static_cast<size_t>(f.engine.trace_max_spans));
    if (Status ts = trace->stream_to(f.engine.trace); !ts.is_ok()) fail("worker", ts.with_context("--trace"));
    trace_ffn_batches(trace, &fo);
  }
  ThreadPool pool(f.engine.threads);
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
        [sample] {
          return std::make_pair(200, "{\"status\":\"ok\",\"role\":\"ffn\",\"attention_serving\":" +
                                         std::to_string(sample.stats->attention_serving.load()) +
                                         ",\"attention_expected\":" + std::to_string(sample.info.n_attention) + "}");
        });
    if (!st.ok()) fail("worker", st.status().with_context("--metrics-listen"));
    status = std::move(*st);
    spdlog::info("ffn worker {}: metrics on http://{}:{}/metrics", shard, so.host, status->port());
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  spdlog::info("ffn worker {}/{} (FFN TP degree {}) listening on {} for {} attention worker(s)", shard, n_shards,
               f.engine.ffn_tp, listen, f.n_attention);
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

void run_attention(WorkerFlags f) {
  if (f.engine.ffn.empty())
    fail("worker", invalid_argument("--role attention needs --ffn host:port,... (the FFN workers, in shard order)"));
  if (f.engine.spawn_ffn) fail("worker", invalid_argument("--spawn-ffn is for afd serve|generate, not a worker"));
  if (f.listen.empty())
    fail("worker", invalid_argument("--role attention needs --listen host:port (its HTTP address)"));
  if (f.n_attention < 1 || f.n_attention > 64) fail("worker", invalid_argument("--attention must be in [1, 64]"));
  if (Status s = split_host_port(f.listen, &f.service.host, &f.service.port); !s.is_ok())
    fail("worker", s.with_context("--listen"));
  if (Status s = f.service.validate(); !s.is_ok()) fail("worker", s);
  // The bundle's topology: --topology if given, else --attention x and the --ffn list.
  if (f.engine.topology == "mono") {
    const size_t y = std::count(f.engine.ffn.begin(), f.engine.ffn.end(), ',') + 1;
    f.engine.topology = std::to_string(f.n_attention) + "A" + std::to_string(y) + "F";
  }
  auto opt = f.engine.to_options();
  if (!opt.ok()) fail("worker", opt.status());
  auto topo = parse_topology(opt->topology);
  if (!topo.ok()) fail("worker", topo.status());
  if (opt->attention_index < 0 || opt->attention_index >= topo->n_attention)
    fail("worker", invalid_argument("--attention-index " + std::to_string(opt->attention_index) + " is outside [0, " +
                                    std::to_string(topo->n_attention) + ") of topology " + opt->topology));
  spdlog::info("attention worker {}/{}: waiting for FFN workers {}, then serving on {}", opt->attention_index,
               topo->n_attention, f.engine.ffn, f.listen);
  ServiceExtras extras;
  extras.trace_path = f.engine.trace;
  run_engine_service("worker", f.service, *opt,
                     "afd worker: attention worker " + std::to_string(opt->attention_index) + "/" +
                         std::to_string(topo->n_attention) + " serving model '{model}'",
                     "", extras);
}

// Fills the flags of worker `index` with role `role` from the topology file.
void apply_topology_file(WorkerFlags* f) {
  auto t = load_topology_file(f->topology_file);
  if (!t.ok()) fail("worker", t.status());
  const auto& ws = f->role == "ffn" ? t->ffn : t->attention;
  if (f->index < 0 || f->index >= static_cast<int>(ws.size()))
    fail("worker", invalid_argument("--index " + std::to_string(f->index) + ": " + f->topology_file + " has " +
                                    std::to_string(ws.size()) + " " + f->role + " worker(s)"));
  const TopologyWorker& w = ws[f->index];
  EngineFlags& e = f->engine;
  e.model_dir = w.model_dir;
  e.precision = t->precision;
  e.kv_dtype = t->kv_dtype;
  e.threads = w.threads;
  e.microbatches = w.microbatches > 0 ? std::to_string(w.microbatches) : "";  // 0: the engine's default
  e.topology = t->topology();
  e.ffn_timeout_ms = t->ffn_timeout_ms;
  e.ffn_connect_timeout_ms = t->ffn_connect_timeout_ms;
  e.ffn_probe_ms = t->ffn_probe_ms;
  if (t->ffn_takeover_s >= 0) e.ffn_takeover_s = t->ffn_takeover_s;
  e.ffn_parts = t->ffn_parts;
  e.ffn_tp = t->ffn_tp;
  if (f->role == "ffn") {
    e.ffn_device = w.device;
    if (!w.metrics_listen.empty()) f->metrics_listen = w.metrics_listen;
  }
  if (t->ucx_spin_us >= 0) e.ucx_spin_us = t->ucx_spin_us;
  const TopologyScheduler& sc = t->scheduler;
  if (sc.max_running >= 0) f->service.max_running = sc.max_running;
  if (sc.max_queue >= 0) f->service.max_queue = sc.max_queue;
  if (sc.max_batch_tokens >= 0) f->service.max_batch_tokens = sc.max_batch_tokens;
  if (sc.max_context >= 0) f->service.max_context = sc.max_context;
  if (sc.max_seqs >= 0) e.max_seqs = sc.max_seqs;
  if (sc.kv_capacity >= 0) e.kv_capacity = sc.kv_capacity;
  if (sc.kv_block >= 0) e.kv_block = sc.kv_block;
  if (sc.step_retry_s >= 0) f->service.step_retry_s = sc.step_retry_s;
  if (sc.drain_timeout_s >= 0) f->service.drain_timeout_s = sc.drain_timeout_s;
  f->listen = w.listen;
  f->n_attention = static_cast<int>(t->attention.size());
  f->peer_timeout_ms = t->peer_timeout_ms;
  f->service.model_name = t->frontend.model_name;
  if (f->role == "ffn") {
    f->shard = std::to_string(f->index) + "/" + std::to_string(t->ffn.size());
  } else {
    e.ffn = t->ffn_addresses();
    e.attention_index = f->index;
  }
}

void run_worker(WorkerFlags f) {
  if (f.role != "ffn" && f.role != "attention")
    fail("worker", invalid_argument("--role '" + f.role + "': ffn | attention"));
  if (!f.topology_file.empty()) apply_topology_file(&f);
  else if (f.index >= 0) fail("worker", invalid_argument("--index is for --topology-file"));
  if (f.engine.model_dir.empty()) fail("worker", invalid_argument("--model DIR is required (or --topology-file)"));
  if (f.role == "attention" && !f.metrics_listen.empty())
    fail("worker",
         invalid_argument("--metrics-listen is for --role ffn; an attention worker serves /metrics on --listen"));
  if (f.role == "ffn") run_ffn(f);
  else run_attention(std::move(f));
}

}  // namespace

void register_worker(CLI::App& app) {
  auto f = std::make_shared<WorkerFlags>();
  auto* cmd = app.add_subcommand("worker", "Run one FFN or attention worker process of an AFD deployment");
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
  cmd->add_option("--attention", f->n_attention, "Attention workers in the deployment (x of xAyF)")
      ->envname("AFD_N_ATTENTION");
  cmd->add_option("--peer-timeout-ms", f->peer_timeout_ms, "FFN: wait for a mid-step attention worker this long")
      ->envname("AFD_PEER_TIMEOUT_MS");
  auto* file_opt =
      cmd->add_option("--topology-file", f->topology_file,
                      "Take every setting from this JSON file (docs/DEPLOYMENT.md); needs --role and --index")
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
  cmd->callback([f] { run_worker(*f); });
}

}  // namespace afd::cli
