// afd serve: the OpenAI-compatible HTTP API (docs/SERVING.md), in one of three shapes:
//   in-process (default)   — engines, schedulers and the API in this process (--workers N,
//                            --topology xAyF with in-process or --ffn / --spawn-ffn FFN workers);
//   front end              — the API over attention worker processes (docs/DEPLOYMENT.md):
//                            --attention-workers host:port,... or --topology-file F (re-read
//                            on SIGHUP and POST /admin/reload); /admin/attention adds and
//                            removes attention workers while it runs;
//   --spawn-workers        — the front end plus every worker of --topology xAyF (or of
//                            --topology-file F) as local child processes, stopped on exit.
// Settings: topology file, then AFD_* environment mirrors, then flags
// (apps/deployment_config.h); --print-config prints them with their sources and exits.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <thread>

#include "commands.h"
#include "core/log.h"
#include "deployment_config.h"
#include "engine_flags.h"
#include "local_ffn.h"
#include "model/config.h"
#include "runtime/topology.h"
#include "runtime/topology_file.h"
#include "serve/api/internal_stream.h"
#include "serve_autoscaler.h"
#include "serve_stack.h"
#include "trace_output.h"

namespace afd::cli {

namespace {

struct ServeFlags {
  EngineFlags engine;
  ServiceFlags service;
  std::string attention_workers;  // front end over these attention workers
  std::string topology_file;
  bool spawn_workers = false;
  bool in_process = false;
  int worker_restarts = 5;  // per worker per minute; 0: never
  bool exit_on_worker_loss = false;
  double upstream_idle_timeout_s = 15;  // front end: an attention worker silent this long mid-request stalled
  double failover_timeout_s = 30;       // front end: how long a request may wait to continue elsewhere
  double wait_for_worker_s = 0;         // front end: how long a new request may wait for a worker to be up
  std::string failover_replay = "exact";  // front end: how a continuation recomputes generated tokens
  bool print_config = false;
  // --autoscale (serve_autoscaler.h): on a spawned xAyF topology only.
  bool autoscale = false;
  AutoscaleSettings autoscale_settings;
};

// --exit-on-worker-loss where this command starts no worker process to lose.
void refuse_exit_on_loss(const ServeFlags& f, const char* shape) {
  if (f.exit_on_worker_loss)
    fail("serve", invalid_argument(std::string("--exit-on-worker-loss: ") + shape +
                                   " starts no worker process (it applies to --topology xAyF, --spawn-workers and "
                                   "--spawn-ffn)"));
}

RestartPolicy restart_policy(const ServeFlags& f) {
  RestartPolicy p;
  p.max_per_minute = f.worker_restarts;
  return p;
}

serve::FrontendOptions frontend_options(const ServeFlags& f) {
  serve::FrontendOptions fo;
  fo.server = f.service.server();
  fo.model_dir = f.engine.options.model_dir;
  fo.model_name = f.service.options.model_name;
  fo.max_context = f.service.options.max_context;
  fo.proxy.idle_timeout_s = f.upstream_idle_timeout_s;
  fo.proxy.failover_timeout_s = f.failover_timeout_s;
  fo.proxy.wait_for_worker_s = f.wait_for_worker_s;
  fo.proxy.exact_replay = f.failover_replay == "exact";
  return fo;
}

// --topology-file F (read into t; its front-end settings are in f already): the front end
// (and with --spawn-workers, every worker) from F.
void serve_topology_file(const ServeFlags& f, const TopologyFile* t) {
  serve::FrontendOptions fo = frontend_options(f);
  for (const auto& w : t->attention) fo.workers.push_back(w.address);
  // FFN workers with a "metrics" listener join the front end's /metrics (at the host their
  // "address" names when they listen on a wildcard).
  for (size_t j = 0; j < t->ffn.size(); ++j) {
    const auto& w = t->ffn[j];
    if (w.metrics_listen.empty()) continue;
    std::string host;
    int port = 0;
    if (Status s = split_host_port(w.address, &host, &port); !s.is_ok())
      fail("serve", s.with_context("ffn[" + std::to_string(j) + "].address"));
    auto target = serve::metrics_target_for(w.metrics_listen, host, "");
    if (!target.ok()) fail("serve", target.status().with_context("ffn[" + std::to_string(j) + "].metrics"));
    fo.metrics_targets.push_back(*target);
  }
  // The front end itself runs no engine: a trace comes from the workers this command starts.
  const std::string& trace = f.engine.trace;
  if (!trace.empty() && !f.spawn_workers)
    fail("serve", invalid_argument("--trace with --topology-file needs --spawn-workers (workers started elsewhere "
                                   "take --trace themselves)"));
  std::vector<std::string> trace_parts;
  ChildProcesses children;
  if (!f.spawn_workers) refuse_exit_on_loss(f, "--topology-file without --spawn-workers");
  // Workers started elsewhere: POST /admin/reload and SIGHUP re-read the file.
  if (!f.spawn_workers) fo.topology_file = f.topology_file;
  if (f.spawn_workers) {
    const std::string abs = std::filesystem::absolute(f.topology_file).string();
    for (const char* role : {"ffn", "attention"}) {
      const size_t n = std::string(role) == "ffn" ? t->ffn.size() : t->attention.size();
      for (size_t i = 0; i < n; ++i) {
        const std::string name = std::string(role) + " worker " + std::to_string(i);
        std::vector<std::string> args = {"worker", "--topology-file", abs, "--role", role, "--index", std::to_string(i)};
        if (!trace.empty()) {
          trace_parts.push_back(trace_part_path(trace, role, static_cast<int>(i)));
          args.insert(args.end(), {"--trace", trace_parts.back(), "--trace-max-spans",
                                   std::to_string(f.engine.trace_max_spans)});
        }
        auto pid = children.spawn_self(args, name);
        if (!pid.ok()) fail("serve", pid.status());
        spdlog::info("started {} as process {}", name, *pid);
      }
    }
  }
  run_frontend("serve", std::move(fo), static_cast<int>(t->ffn.size()), &children, restart_policy(f),
               f.service.drain_timeout_s, f.exit_on_worker_loss);
  if (Status s = merge_trace_parts("serve", trace, trace_parts, /*include_path=*/false); !s.is_ok()) fail("serve", s);
}

// --autoscale: the routed experts are cut into enough parts (--ffn-parts) for --max-ffn FFN
// workers to hold some each (a worker beyond the parts would be a standby): by default
// --max-ffn, at most the model's routed experts and 64.
Result<int> autoscale_ffn_parts(const ServeFlags& f) {
  AFD_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(f.engine.options.model_dir));
  const int64_t max_ffn = f.autoscale_settings.controller.bounds.max_ffn;
  int64_t parts = f.engine.options.afd.ffn_parts;
  if (parts == 0) parts = std::min<int64_t>({max_ffn, std::max<int64_t>(cfg.n_experts, 1), 64});
  if (parts < max_ffn)
    return invalid_argument("--autoscale --max-ffn " + std::to_string(max_ffn) + ": the routed experts are cut into " +
                            std::to_string(parts) + " parts (--ffn-parts; at most the model's " +
                            std::to_string(cfg.n_experts) + " routed experts and 64), so at most " +
                            std::to_string(parts) + " FFN workers can hold any: lower --max-ffn to " +
                            std::to_string(parts));
  return static_cast<int>(parts);
}

// --spawn-workers with --topology xAyF: x attention + y FFN worker processes on free local ports.
void serve_spawned(const ServeFlags& f) {
  auto topo = parse_topology(f.engine.topology);
  if (!topo.ok()) fail("serve", topo.status());
  if (topo->wiring != Wiring::afd)
    fail("serve", invalid_argument("--spawn-workers needs an xAyF --topology (or --topology-file), got '" +
                                   f.engine.topology + "'"));
  if (!f.engine.ffn.empty() || f.engine.spawn_ffn)
    fail("serve", invalid_argument("--spawn-workers starts the FFN workers itself: drop --ffn / --spawn-ffn"));
  if (f.service.workers != 1)
    fail("serve", invalid_argument("--spawn-workers: one attention engine per process; drop --workers"));
  // Split the cores between the processes unless --threads says otherwise.
  const int procs = topo->n_attention + topo->n_ffn;
  const int threads =
      f.engine.options.n_threads > 0 ? f.engine.options.n_threads
                           : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / procs);
  EngineFlags e = f.engine;  // with --autoscale's --ffn-parts
  if (f.autoscale) {
    if (Status s = check_autoscale_start(f.autoscale_settings, topo->n_attention, topo->n_ffn); !s.is_ok())
      fail("serve", s);
    auto parts = autoscale_ffn_parts(f);
    if (!parts.ok()) fail("serve", parts.status());
    e.options.afd.ffn_parts = *parts;
  }
  ChildProcesses children;
  auto ffn = spawn_ffn_workers(&children, topo->n_attention, topo->n_ffn, e, threads, /*with_metrics=*/true);
  if (!ffn.ok()) fail("serve", ffn.status());
  std::vector<std::string> trace_parts = ffn->trace_parts;  // the attention workers' are added below
  std::string ffn_list;
  for (const auto& a : ffn->addresses) ffn_list += (ffn_list.empty() ? "" : ",") + a;
  serve::FrontendOptions fo = frontend_options(f);
  fo.metrics_targets = ffn->metrics;
  // The front end sends each request with a control line of token ids before the client's
  // body (serve/api/internal_stream.h): the workers' body limit leaves room for it.
  int64_t context = f.service.options.max_context;
  if (context <= 0) {
    auto cfg = load_model_config(e.options.model_dir);
    if (!cfg.ok()) fail("serve", cfg.status());
    context = cfg->max_position_embeddings;
  }
  const serve::ServerOptions& server = f.service.options.server;
  const serve::SchedulerOptions& sched = f.service.options.scheduler;
  const int64_t worker_max_body =
      serve::internal_body_limit(static_cast<int64_t>(server.limits.max_body_bytes), context);
  // Attention worker i on a free port, dialing ffn_list under `topology` (x bounds its index).
  auto start_attention = [&](int i, const std::string& ffn_list, const std::string& topology) -> Result<ScaledWorker> {
    AFD_ASSIGN_OR_RETURN(int port, children.reserve_port());
    const std::string addr = "127.0.0.1:" + std::to_string(port);
    std::vector<std::string> args = {"worker", "--role", "attention", "--model", e.options.model_dir, "--listen", addr,
                                     "--topology", topology, "--ffn", ffn_list, "--attention-index",
                                     std::to_string(i), "--precision", e.precision, "--kv-dtype", e.kv_dtype,
                                     "--kv-capacity", std::to_string(e.options.kv.capacity_tokens), "--kv-block",
                                     std::to_string(e.options.kv.block_size), "--max-seqs",
                                     std::to_string(e.options.kv.max_seqs),
                                     "--threads", std::to_string(threads),
                                     "--fp8-group", std::to_string(e.options.afd.fp8_group), "--ffn-timeout-ms",
                                     std::to_string(e.options.afd.ffn_timeout_ms), "--ucx-spin-us",
                                     std::to_string(e.options.afd.ucx_spin_us),
                                     "--ffn-connect-timeout-ms",
                                     std::to_string(e.options.afd.ffn_connect_timeout_ms), "--ffn-probe-ms",
                                     std::to_string(e.options.afd.ffn_probe_ms), "--ffn-takeover-s",
                                     std::to_string(e.ffn_takeover_s), "--ffn-parts",
                                     std::to_string(e.options.afd.ffn_parts), "--max-running",
                                     std::to_string(sched.max_running), "--step-retry-s",
                                     std::to_string(sched.step_retry_s), "--max-queue",
                                     std::to_string(sched.max_queue), "--max-batch-tokens",
                                     std::to_string(sched.max_batch_tokens), "--max-context",
                                     std::to_string(f.service.options.max_context), "--max-body",
                                     std::to_string(worker_max_body), "--http-threads",
                                     std::to_string(server.http_threads), "--content-special-tokens",
                                     f.service.content_special_tokens, "--admission-inline-bytes",
                                     std::to_string(server.admission.inline_max_bytes), "--admission-queue",
                                     std::to_string(server.admission.max_waiting)};
    if (!e.microbatches.empty()) args.insert(args.end(), {"--microbatches", e.microbatches});
    if (e.no_prefix_cache) args.push_back("--no-prefix-cache");
    if (e.options.deterministic) args.push_back("--deterministic");
    if (!e.options.emulation.stage_costs_file.empty())
      args.insert(args.end(), {"--emulate-stage-costs", e.options.emulation.stage_costs_file});
    if (e.options.afd.eplb)
      args.insert(args.end(), {"--eplb", "--eplb-interval-s", std::to_string(e.options.afd.eplb_interval_s),
                               "--eplb-redundant", std::to_string(e.options.afd.eplb_redundant)});
    // The method and the max batch are the flags' text (to_options() fills the options).
    if (SpeculativeMethod m = SpeculativeMethod::none;
        speculative_method_from_name(e.speculative, &m) && m != SpeculativeMethod::none)
      args.insert(args.end(), {"--speculative", e.speculative, "--draft-tokens",
                               std::to_string(e.options.speculative.draft_tokens), "--ngram-min",
                               std::to_string(e.options.speculative.ngram_min), "--ngram-max",
                               std::to_string(e.options.speculative.ngram_max), "--speculative-max-batch",
                               e.speculative_max_batch});
    if (!e.trace.empty()) {
      trace_parts.push_back(trace_part_path(e.trace, "attention", i));
      args.insert(args.end(), {"--trace", trace_parts.back(), "--trace-max-spans", std::to_string(e.trace_max_spans)});
    }
    if (!f.service.options.model_name.empty()) {
      args.push_back("--model-name");
      args.push_back(f.service.options.model_name);
    }
    ScaledWorker w;
    w.name = "attention worker " + std::to_string(i);
    w.address = addr;
    w.index = i;
    AFD_ASSIGN_OR_RETURN(pid_t pid, children.spawn_self(args, w.name));
    spdlog::info("started {} as process {} on {}", w.name, pid, addr);
    return w;
  };
  std::vector<ScaledWorker> attention;
  for (int i = 0; i < topo->n_attention; ++i) {
    auto w = start_attention(i, ffn_list, e.topology);
    if (!w.ok()) fail("serve", w.status());
    fo.workers.push_back(w->address);
    attention.push_back(std::move(*w));
  }
  std::unique_ptr<ServeAutoscaler> autoscaler;
  if (f.autoscale) {
    std::vector<ScaledWorker> ffn_workers;
    for (size_t j = 0; j < ffn->addresses.size(); ++j)
      ffn_workers.push_back({ffn->names[j], ffn->addresses[j], static_cast<int>(j), ffn->metrics[j]});
    WorkerStarters starters;
    starters.attention = [&, topo = *topo](int i, const std::vector<std::string>& members) -> Result<ScaledWorker> {
      std::string list;
      for (const auto& a : members) list += (list.empty() ? "" : ",") + a;
      // Its topology: x large enough for its index, y the FFN workers it dials.
      const std::string t = std::to_string(std::max(topo.n_attention, i + 1)) + "A" + std::to_string(members.size()) + "F";
      return start_attention(i, list, t);
    };
    starters.ffn = [&, n_attention = topo->n_attention](int j) -> Result<ScaledWorker> {
      AFD_ASSIGN_OR_RETURN(SpawnedFfnWorker w,
                           spawn_ffn_worker(&children, j, j + 1, n_attention, e, threads, /*with_metrics=*/true));
      return ScaledWorker{w.name, w.address, j, w.metrics};
    };
    auto a = ServeAutoscaler::create(f.autoscale_settings, std::move(attention), std::move(ffn_workers), &children,
                                     std::move(starters));
    if (!a.ok()) fail("serve", a.status());
    autoscaler = std::move(*a);
  }
  run_frontend("serve", std::move(fo), topo->n_ffn, &children, restart_policy(f), f.service.drain_timeout_s,
               f.exit_on_worker_loss, autoscaler.get());  // returns with the workers stopped
  if (Status s = merge_trace_parts("serve", e.trace, trace_parts, /*include_path=*/false); !s.is_ok()) fail("serve", s);
}

// fp: the flags CLI11 filled (a topology file's front-end values are written into them too).
void run_serve(ServeFlags* fp, CLI::App* cmd) {
  DeploymentConfig cfg = DeploymentConfig::of(cmd);
  TopologyFile topology_file;
  if (!fp->topology_file.empty()) {
    auto t = load_topology_file(fp->topology_file);
    if (!t.ok()) fail("serve", t.status());
    if (Status s = cfg.apply(t->frontend_settings(), fp->topology_file); !s.is_ok()) fail("serve", s);
    topology_file = std::move(*t);
  }
  const ServeFlags& f = *fp;
  // The one validation of the merged settings (errors name the flags and where their values
  // came from); the engine flags matter to every shape but the front end over existing workers.
  if (Status s = f.service.validate(); !s.is_ok()) fail("serve", cfg.with_sources(s));
  if (f.topology_file.empty() && f.attention_workers.empty()) {
    if (auto o = f.engine.to_options(/*open_trace=*/false); !o.ok()) fail("serve", cfg.with_sources(o.status()));
  }
  if (f.print_config) {
    std::printf("%s\n", cfg.to_json().dump(2).c_str());
    return;
  }
  if (f.autoscale && !f.topology_file.empty())
    fail("serve", invalid_argument("--autoscale needs --topology xAyF (the workers of a topology file are its own)"));
  if (f.autoscale && !f.engine.trace.empty())
    fail("serve", invalid_argument("--autoscale with --trace: workers it adds would write no trace part; drop one"));
  if (f.autoscale && f.engine.options.afd.ffn_tp > 1)
    fail("serve", invalid_argument("--autoscale adds and removes single FFN workers: it needs --ffn-tp 1"));
  if (!f.topology_file.empty()) return serve_topology_file(f, &topology_file);
  if (!std::filesystem::is_directory(f.engine.options.model_dir))
    fail("serve",
         not_found("model directory '" + f.engine.options.model_dir +
                   "' does not exist (create one: afd make-model --preset tiny --out " +
                   f.engine.options.model_dir + ")"));
  if (f.spawn_workers) return serve_spawned(f);
  // An xAyF topology with no FFN workers named: one process per worker behind the front end
  // (the deployment the topology describes), unless --in-process asks for threads.
  if (!f.in_process && f.engine.ffn.empty() && !f.engine.spawn_ffn && f.service.workers == 1) {
    auto topo = parse_topology(f.engine.topology);
    if (topo.ok() && topo->wiring == Wiring::afd) return serve_spawned(f);
  }
  if (f.autoscale)
    fail("serve", invalid_argument("--autoscale starts and stops worker processes: it needs the spawned deployment of "
                                   "an xAyF --topology (with --spawn-workers, or without --ffn, --spawn-ffn and "
                                   "--in-process)"));
  if (!f.attention_workers.empty()) {
    if (!f.engine.trace.empty())
      fail("serve", invalid_argument("--trace with --attention-workers: the front end runs no engine; start the "
                                     "workers with --trace"));
    refuse_exit_on_loss(f, "--attention-workers");
    serve::FrontendOptions fo = frontend_options(f);
    auto workers = parse_address_list("--attention-workers", f.attention_workers);
    if (!workers.ok()) fail("serve", workers.status());
    fo.workers = std::move(*workers);
    return run_frontend("serve", std::move(fo), 0, nullptr, {}, f.service.drain_timeout_s);
  }
  auto opt = f.engine.to_options();
  if (!opt.ok()) fail("serve", opt.status());
  // --spawn-ffn: the topology's FFN workers as child processes (outlive the engines).
  if (f.engine.spawn_ffn && f.service.workers != 1)
    fail("serve", invalid_argument("--spawn-ffn hosts the topology's attention workers itself; use --workers 1"));
  if (!f.engine.spawn_ffn) refuse_exit_on_loss(f, "in-process serving without --spawn-ffn");
  LocalFfnProcesses ffn_procs;
  if (Status s = ffn_procs.start(f.engine, &*opt, /*with_metrics=*/true); !s.is_ok()) fail("serve", s);
  ServiceExtras extras;
  extras.federate = ffn_procs.metrics_targets();
  extras.trace_path = f.engine.trace;
  if (f.engine.spawn_ffn) {
    extras.children = ffn_procs.children();
    extras.restart = restart_policy(f);
    extras.exit_on_worker_loss = f.exit_on_worker_loss;
  }
  const int n = f.service.workers;
  run_engine_service("serve", f.service, *opt, "afd serve: model '{model}'",
                     " (" + std::to_string(n) + " worker" + (n > 1 ? "s" : "") + ")" +
                         (f.service.options.server.api_key.empty() ? "" : ", API key required"),
                     extras);
  if (opt->observability.trace) {
    if (Status s = ffn_procs.merge_traces("serve", f.engine.trace); !s.is_ok()) fail("serve", s);
  }
}

}  // namespace

void register_serve(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, streaming)");
  add_print_config(cmd, &f->print_config);
  f->engine.options.model_dir = "models/tiny";
  f->engine.add_to(cmd, /*model_required=*/false);
  f->service.add_to(cmd, /*public_api=*/true);
  auto* workers_opt =
      cmd->add_option("--attention-workers", f->attention_workers,
                      "Front end only: proxy to these attention workers (host:port,...; afd worker --role attention)")
          ->check([](const std::string& v) { return v.empty() ? std::string("names no attention worker") : std::string(); })
          ->envname("AFD_ATTENTION_WORKERS");
  auto* file_opt = cmd->add_option("--topology-file", f->topology_file,
                                   "Front end of the deployment in this JSON file (docs/DEPLOYMENT.md); the file names "
                                   "the workers, so --attention-workers, --topology, --ffn and --spawn-ffn are refused "
                                   "with it, and other engine flags are ignored; --host, --port, --api-key, "
                                   "--model-name and --model override its front-end values")
                       ->envname("AFD_TOPOLOGY_FILE");
  // The file describes the deployment: a flag that describes another one is an error, not
  // silently ignored.
  file_opt->excludes(workers_opt);
  for (const char* name : {"--topology", "--ffn", "--spawn-ffn"}) file_opt->excludes(cmd->get_option(name));
  workers_opt->excludes(cmd->get_option("--spawn-ffn"));
  cmd->add_flag("--spawn-workers", f->spawn_workers,
                "Start every worker of --topology xAyF (or --topology-file) as a local process behind a front end "
                "(the default for --topology xAyF without --ffn / --spawn-ffn)")
      ->envname("AFD_SPAWN_WORKERS");
  cmd->add_option("--worker-restarts", f->worker_restarts,
                  "Worker processes this command started (--topology xAyF, --spawn-workers, --spawn-ffn) that exit "
                  "are started again, at most this many times a minute each (0: never); past that a worker is lost: "
                  "/health 503 names it")
      ->check(CLI::Range(0, 1000))
      ->envname("AFD_WORKER_RESTARTS");
  cmd->add_flag("--exit-on-worker-loss", f->exit_on_worker_loss,
                "When a worker process this command started is lost (its restarts are exhausted or off), drain and "
                "exit with status 1, so a supervisor (systemd, Kubernetes) restarts the whole bundle")
      ->envname("AFD_EXIT_ON_WORKER_LOSS");
  cmd->add_option("--upstream-idle-timeout-s", f->upstream_idle_timeout_s,
                  "Front end: an attention worker that sends nothing for this long while it holds a request (it "
                  "sends a token or a keep-alive at least every quarter of it) has stalled: the request continues "
                  "on another worker")
      ->check(CLI::Range(0.5, 3600.0))
      ->envname("AFD_UPSTREAM_IDLE_TIMEOUT_S")
      ->capture_default_str();
  cmd->add_option("--failover-timeout-s", f->failover_timeout_s,
                  "Front end: after an attention worker fails mid-request, how long the request may wait for "
                  "another worker to continue it (then 503, or an error event if the client has bytes already)")
      ->check(CLI::Range(0.0, 3600.0))
      ->envname("AFD_FAILOVER_TIMEOUT_S")
      ->capture_default_str();
  cmd->add_option("--wait-for-worker-s", f->wait_for_worker_s,
                  "Front end: a new request that no attention worker can take (none up, e.g. while their FFN "
                  "worker is restarted or taken over) waits up to this long for one instead of an immediate 503 + "
                  "Retry-After (0: answer at once)")
      ->check(CLI::Range(0.0, 3600.0))
      ->envname("AFD_WAIT_FOR_WORKER_S")
      ->capture_default_str();
  cmd->add_option("--failover-replay", f->failover_replay,
                  "Front end: how the worker continuing a request recomputes the tokens generated before: 'exact' "
                  "(one per step, as decoding computed them: the text equals an unfaulted run's) or 'prefill' (one "
                  "pass, faster for long outputs; a near tie may later go another way)")
      ->check(CLI::IsMember({"exact", "prefill"}))
      ->envname("AFD_FAILOVER_REPLAY")
      ->capture_default_str();
  cmd->add_option("--ffn-peer-timeout-ms", f->engine.ffn_peer_timeout_ms,
                  "FFN worker processes this command starts (--topology xAyF, --spawn-ffn): how long a batch waits "
                  "for an attention worker that is mid-step before it is served without it (a stopped attention "
                  "worker holds up the others this long)")
      ->check(CLI::Range(1, 86400000))
      ->envname("AFD_FFN_PEER_TIMEOUT_MS")
      ->capture_default_str();
  AutoscaleSettings& as = f->autoscale_settings;
  as.controller.bounds.max_attn = 8;
  as.controller.bounds.max_ffn = 8;
  as.controller.fit_ffn_fixed_cost = false;  // serve_autoscaler.h
  cmd->add_flag("--autoscale", f->autoscale,
                "Spawned --topology xAyF: every --autoscale-interval-s, read the workers' stage times and add or "
                "remove an FFN or attention worker when the A/F ratio is off the ratio theory's optimum by more "
                "than --autoscale-hysteresis (docs/DEPLOYMENT.md \"Autoscaling\")")
      ->envname("AFD_AUTOSCALE");
  cmd->add_option("--autoscale-interval-s", as.interval_s, "--autoscale: seconds per measured window")
      ->check(CLI::Range(0.2, 86400.0))
      ->envname("AFD_AUTOSCALE_INTERVAL_S")
      ->capture_default_str();
  cmd->add_option("--autoscale-hysteresis", as.controller.hysteresis,
                  "--autoscale: act when |r*/r - 1| exceeds this (r = attention/FFN workers, r* the optimum)")
      ->check(CLI::Range(0.01, 1.0))
      ->envname("AFD_AUTOSCALE_HYSTERESIS")
      ->capture_default_str();
  cmd->add_option("--min-attention", as.controller.bounds.min_attn, "--autoscale: fewest attention workers")
      ->check(CLI::Range(1, 4096))
      ->envname("AFD_MIN_ATTENTION")
      ->capture_default_str();
  cmd->add_option("--max-attention", as.controller.bounds.max_attn, "--autoscale: most attention workers")
      ->check(CLI::Range(1, 4096))
      ->envname("AFD_MAX_ATTENTION")
      ->capture_default_str();
  cmd->add_option("--min-ffn", as.controller.bounds.min_ffn, "--autoscale: fewest FFN workers")
      ->check(CLI::Range(1, 4096))
      ->envname("AFD_MIN_FFN")
      ->capture_default_str();
  cmd->add_option("--max-ffn", as.controller.bounds.max_ffn, "--autoscale: most FFN workers")
      ->check(CLI::Range(1, 4096))
      ->envname("AFD_MAX_FFN")
      ->capture_default_str();
  cmd->add_flag("--in-process", f->in_process,
                "--topology xAyF: run the attention engines and FFN workers as threads of this one process")
      ->envname("AFD_IN_PROCESS");
  cmd->callback([f, cmd] { run_serve(f.get(), cmd); });
}

}  // namespace afd::cli
