#include "serve_stack.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "model/weights.h"
#include "reload_on_hangup.h"
#include "runtime/bundle.h"
#include "serve_autoscaler.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/system_fingerprint.h"
#include "serve/frontend/proxy_client.h"
#include "serve/metrics/ffn_metrics.h"
#include "serve/metrics/metrics.h"
#include "serve/metrics/metrics_federation.h"
#include "serve/scheduling/ffn_admin.h"
#include "trace_output.h"

namespace afd::cli {

namespace {
// Bytes on the pipe: a signal's number, kStopRequested (request_stop), or 0 (the
// StopOnSignal is being destroyed).
int g_signal_pipe[2] = {-1, -1};
constexpr unsigned char kStopRequested = 255;
std::mutex g_stop_mu;
std::string g_stop_why;  // g_stop_mu: request_stop's reason

bool signal_pipe_ready() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] { ok = pipe2(g_signal_pipe, O_CLOEXEC) == 0; });
  return ok;
}

extern "C" void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  ssize_t r = write(g_signal_pipe[1], &b, 1);
  (void)r;
}

// Replaced by the lost-worker text of the watched children, if any.
class LossAwareEngine final : public Engine {
 public:
  LossAwareEngine(std::unique_ptr<Engine> inner, ChildProcesses* children)
      : inner_(std::move(inner)), children_(children) {}
  const ModelConfig& config() const override { return inner_->config(); }
  Result<int64_t> create_sequence() override { return inner_->create_sequence(); }
  void release_sequence(int64_t id) override { inner_->release_sequence(id); }
  int64_t sequence_length(int64_t id) const override { return inner_->sequence_length(id); }
  bool can_append(int64_t id, int64_t n) const override { return inner_->can_append(id, n); }
  int64_t kv_blocks_needed(int64_t id, int64_t n) const override { return inner_->kv_blocks_needed(id, n); }
  int kv_pool(int64_t id) const override { return inner_->kv_pool(id); }
  KvUsage kv_pool_usage(int pool) const override { return inner_->kv_pool_usage(pool); }
  int64_t reuse_prefix(int64_t id, std::span<const int32_t> p) override { return inner_->reuse_prefix(id, p); }
  int64_t cached_prefix(std::span<const int32_t> p) const override { return inner_->cached_prefix(p); }
  Status forward(std::span<const BatchItem> items, std::vector<float>* logits) override {
    return inner_->forward(items, logits);
  }
  Status forward_with_hidden(std::span<const BatchItem> items, std::vector<float>* logits,
                             std::vector<float>* hidden) override {
    return inner_->forward_with_hidden(items, logits, hidden);
  }
  Status settle_drafts(int64_t id, int64_t n_accepted) override { return inner_->settle_drafts(id, n_accepted); }
  KvUsage kv_usage() const override { return inner_->kv_usage(); }
  StageTimes last_stage_times() const override { return inner_->last_stage_times(); }
  Status health() const override {
    if (std::string lost = children_->lost(); !lost.empty())
      return unavailable("worker process lost for good (restart afd serve): " + lost);
    return inner_->health();
  }
  BenchmarkHooks* benchmark_hooks() override { return inner_->benchmark_hooks(); }

 private:
  std::unique_ptr<Engine> inner_;
  ChildProcesses* children_;
};
}  // namespace

std::string render_process_metrics(ChildProcesses* children) {
  std::string o;
  const auto states = children->states();
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    serve::prom_header(&o, name, type, help);
    for (const auto& c : states)
      o += std::string(name) + "{process=\"" + c.name + "\"} " + std::to_string(value(c)) + "\n";
  };
  family("afd_frontend_process_up", "gauge", "1 if the worker process this command started is running.",
         [](const ChildProcesses::ChildState& c) { return c.running ? 1 : 0; });
  family("afd_frontend_process_exits_total", "counter", "Times the worker process exited on its own.",
         [](const ChildProcesses::ChildState& c) { return c.exits; });
  family("afd_frontend_process_restarts_total", "counter", "Times the worker process was started again.",
         [](const ChildProcesses::ChildState& c) { return c.restarts; });
  family("afd_frontend_process_lost_total", "counter",
         "Times the worker process was left down for good (restarts exhausted or off, or it could not be started "
         "again): 0 or 1.",
         [](const ChildProcesses::ChildState& c) { return c.lost ? 1 : 0; });
  return o;
}

namespace {
// A byte count held as size_t and parsed as a signed INT flag (its --help type): a negative value
// converts (wrapping) and is refused by ServiceFlags::validate(), which reads it back signed.
CLI::Option* add_bytes_option(CLI::App* cmd, const std::string& name, size_t& bytes, const std::string& help) {
  return cmd->add_option<size_t, int64_t>(name, bytes, help)->default_str(std::to_string(bytes));
}
int64_t as_flag(size_t bytes) { return static_cast<int64_t>(bytes); }
}  // namespace

void ServiceFlags::add_to(CLI::App* cmd, bool public_api) {
  serve::ServerOptions& server = options.server;
  serve::http::Limits& limits = server.limits;
  serve::SchedulerOptions& sched = options.scheduler;
  if (public_api) {
    cmd->add_option("--host", server.host, "Address to bind (127.0.0.1: this machine only)")
        ->envname("AFD_HOST")->capture_default_str();
    cmd->add_option("--port", server.port, "TCP port (0: any free port)")->envname("AFD_PORT")->capture_default_str();
    cmd->add_option("--api-key", server.api_key, "Require 'Authorization: Bearer KEY' on /v1/*")
        ->envname("AFD_API_KEY");
    cmd->add_option("--workers", workers, "Data-parallel attention workers (one engine each)")
        ->envname("AFD_WORKERS")->capture_default_str();
  }
  cmd->add_option("--model-name", options.model_name, "Model id in the API (default: the model directory's name)")
      ->envname("AFD_MODEL_NAME");
  cmd->add_option("--max-running", sched.max_running, "Sequences per batch per worker")
      ->envname("AFD_MAX_RUNNING")->capture_default_str();
  cmd->add_option("--max-queue", sched.max_queue, "Waiting requests per worker before 429")
      ->envname("AFD_MAX_QUEUE")->capture_default_str();
  cmd->add_option("--max-batch-tokens", sched.max_batch_tokens, "Tokens per forward pass (decodes + prefill chunks)")
      ->envname("AFD_MAX_BATCH_TOKENS")->capture_default_str();
  cmd->add_option("--max-context", options.max_context, "Context limit per request (0: the model's)")
      ->envname("AFD_MAX_CONTEXT")->capture_default_str();
  add_bytes_option(cmd, "--max-body", limits.max_body_bytes,
                   "Request body limit in bytes, any transfer encoding (413 above)")
      ->envname("AFD_MAX_BODY");
  cmd->add_option("--content-special-tokens", content_special_tokens,
                  "Control-token text inside chat message content: 'parse' (as Hugging Face: it becomes the control "
                  "token) or 'text' (tokenized as plain text: a role-injection defence)")
      ->check(CLI::IsMember({"parse", "text"}))
      ->envname("AFD_CONTENT_SPECIAL_TOKENS")->capture_default_str();
  cmd->add_option("--http-threads", server.http_threads,
                  "Requests in handlers at once (handler threads; a generation holds one until it ends)")
      ->envname("AFD_HTTP_THREADS")->capture_default_str();
  cmd->add_option("--http-max-connections", limits.max_connections,
                  "Open HTTP connections at once (one more gets 503 and is closed)")
      ->envname("AFD_HTTP_MAX_CONNECTIONS")->capture_default_str();
  cmd->add_option("--http-header-timeout-s", limits.header_timeout_s,
                  "A request's header must arrive within this long of its first byte (408 and close)")
      ->envname("AFD_HTTP_HEADER_TIMEOUT_S")->capture_default_str();
  cmd->add_option("--http-body-timeout-s", limits.body_timeout_s,
                  "A request's body must arrive within this long of its header (408 and close)")
      ->envname("AFD_HTTP_BODY_TIMEOUT_S")->capture_default_str();
  cmd->add_option("--http-idle-timeout-s", limits.idle_timeout_s, "Keep-alive connections idle this long are closed")
      ->envname("AFD_HTTP_IDLE_TIMEOUT_S")->capture_default_str();
  cmd->add_option("--http-write-timeout-s", limits.write_timeout_s,
                  "A client that accepts no byte of its answer for this long is disconnected")
      ->envname("AFD_HTTP_WRITE_TIMEOUT_S")->capture_default_str();
  add_bytes_option(cmd, "--http-max-header-bytes", limits.max_header_bytes,
                   "Request line + header fields, in bytes (431 above)")
      ->envname("AFD_HTTP_MAX_HEADER_BYTES");
  cmd->add_option("--http-max-headers", limits.max_headers, "Header fields per request (431 above)")
      ->envname("AFD_HTTP_MAX_HEADERS")->capture_default_str();
  add_bytes_option(cmd, "--http-max-target", limits.max_target_bytes,
                   "Request target (path + query) in bytes (414 above)")
      ->envname("AFD_HTTP_MAX_TARGET");
  add_bytes_option(cmd, "--admission-inline-bytes", server.admission.inline_max_bytes,
                   "Request bodies larger than this are parsed and tokenized on background-priority threads, using "
                   "only CPU the engine leaves idle")
      ->envname("AFD_ADMISSION_INLINE_BYTES");
  cmd->add_option("--admission-queue", server.admission.max_waiting,
                  "Large request bodies parsed or waiting at once (one more gets 503)")
      ->envname("AFD_ADMISSION_QUEUE")->capture_default_str();
  cmd->add_option("--drain-timeout-s", drain_timeout_s,
                  "On SIGINT/SIGTERM, stop taking requests and let those in flight finish for up to this long (a "
                  "second signal stops at once; 0: stop at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->envname("AFD_DRAIN_TIMEOUT_S")->capture_default_str();
  cmd->add_option("--step-retry-s", sched.step_retry_s,
                  "AFD: when a forward pass fails on a lost or stalled FFN worker, keep its requests and retry it once "
                  "the FFN side is back, for up to this long (0: fail them at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->envname("AFD_STEP_RETRY_S")->capture_default_str();
}

Status ServiceFlags::validate() const {
  const serve::ServerOptions& server = options.server;
  const serve::http::Limits& l = server.limits;
  const serve::SchedulerOptions& sched = options.scheduler;
  if (workers < 1 || workers > 64) return invalid_argument("--workers must be in [1, 64]");
  if (server.port < 0 || server.port > 65535) return invalid_argument("--port must be in [0, 65535]");
  if (drain_timeout_s < 0 || sched.step_retry_s < 0)
    return invalid_argument("--drain-timeout-s and --step-retry-s must be >= 0");
  if (sched.max_running < 1 || sched.max_queue < 0 || sched.max_batch_tokens < 1 || as_flag(l.max_body_bytes) < 1024 ||
      server.http_threads < 1)
    return invalid_argument("--max-running, --max-batch-tokens, --http-threads must be >= 1, --max-body >= 1024");
  if (l.max_connections < 1 || l.max_headers < 1 || as_flag(l.max_header_bytes) < 1024 ||
      as_flag(l.max_target_bytes) < 64 || as_flag(l.max_header_bytes) > (int64_t{1} << 30))
    return invalid_argument(
        "--http-max-connections and --http-max-headers must be >= 1, --http-max-header-bytes in [1024, 2^30], "
        "--http-max-target >= 64");
  if (as_flag(server.admission.inline_max_bytes) < 0 || server.admission.max_waiting < 1)
    return invalid_argument("--admission-inline-bytes must be >= 0 and --admission-queue >= 1");
  for (double t : {l.header_timeout_s, l.body_timeout_s, l.idle_timeout_s, l.write_timeout_s})
    if (!(t > 0 && t <= 86400))
      return invalid_argument("--http-*-timeout-s must be in (0, 86400]");
  return Status();
}

serve::ServerOptions ServiceFlags::server() const {
  serve::ServerOptions s = options.server;
  s.content_special_as_text = content_special_tokens == "text";
  return s;
}

Result<std::unique_ptr<StopOnSignal>> StopOnSignal::start(StopActions a) {
  // The handler only writes the signal's number to a pipe (async-signal-safe), whichever
  // thread takes the signal (libraries such as OpenBLAS start threads before main, so a
  // blocked-mask + sigwait scheme can miss it); a dedicated thread reads the pipe and runs
  // the actions. A 0 byte (no signal has that number) from the destructor ends the thread.
  if (!signal_pipe_ready()) return io_error("pipe() failed");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::unique_ptr<StopOnSignal> s(new StopOnSignal());
  s->thread_ = std::thread([a = std::move(a)] {
    unsigned char sig = 0;
    if (read(g_signal_pipe[0], &sig, 1) != 1 || sig == 0) return;
    std::string cause = "signal " + std::to_string(sig);
    if (sig == kStopRequested) {
      std::lock_guard<std::mutex> l(g_stop_mu);
      cause = g_stop_why;
    }
    if (a.drain && a.drain_timeout_s > 0) {
      spdlog::info("afd: {}: draining (no new requests; up to {} s for those in flight, signal again to stop now)",
                   cause, a.drain_timeout_s);
      a.drain();
      const int64_t t0 = now_ns();
      const int64_t deadline = t0 + static_cast<int64_t>(a.drain_timeout_s * 1e9);
      for (;;) {
        if (a.drained()) {
          spdlog::info("afd: drained in {:.1f} s, stopping", static_cast<double>(now_ns() - t0) * 1e-9);
          break;
        }
        if (now_ns() >= deadline) {
          spdlog::warn("afd: requests still in flight after {} s of draining: stopping anyway", a.drain_timeout_s);
          break;
        }
        pollfd p{g_signal_pipe[0], POLLIN, 0};
        if (::poll(&p, 1, 50) > 0 && read(g_signal_pipe[0], &sig, 1) == 1) {
          if (sig == 0) return;  // destroyed: the server has stopped by itself
          if (sig == kStopRequested) continue;  // already draining
          spdlog::info("afd: signal {} again, stopping now", static_cast<int>(sig));
          break;
        }
      }
    } else {
      spdlog::info("afd: {}, stopping", cause);
    }
    a.stop();
  });
  return s;
}

void StopOnSignal::request_stop(const std::string& why) {
  if (!signal_pipe_ready()) {
    spdlog::error("afd: cannot stop on request ({}): no pipe", why);
    return;
  }
  {
    std::lock_guard<std::mutex> l(g_stop_mu);
    g_stop_why = why;
  }
  const unsigned char b = kStopRequested;
  ssize_t r = write(g_signal_pipe[1], &b, 1);
  (void)r;
}

StopOnSignal::~StopOnSignal() {
  const unsigned char end = 0;
  ssize_t r = write(g_signal_pipe[1], &end, 1);
  (void)r;
  if (thread_.joinable()) thread_.join();
}

void run_engine_service(const char* cmd, const ServiceFlags& f, const EngineOptions& opt, const std::string& banner,
                        const std::string& suffix, const ServiceExtras& extras) {
  // Watched from the start: a worker process lost while the engines connect to it stops the
  // service as soon as it runs (request_stop works before StopOnSignal::start).
  auto lost = std::make_shared<std::atomic<bool>>(false);
  if (extras.children) {
    extras.children->watch(extras.restart, {}, [lost, exit = extras.exit_on_worker_loss](const std::string&) {
      lost->store(true);
      if (exit) StopOnSignal::request_stop("a worker process is lost (--exit-on-worker-loss)");
    });
  }
  // Data-parallel attention workers: one engine each, sharing the compute threads.
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<DataParallelEngine*> afd_engines;  // engines[i] as a bundle's engine; null in the mono wiring
  std::vector<std::unique_ptr<Drafter>> drafters;  // speculative decoding: one per engine
  std::string numerics;  // system_fingerprint of the engines (one model, one set of options)
  for (int w = 0; w < f.workers; ++w) {
    EngineOptions eo = opt;
    if (f.workers > 1 && eo.n_threads == 0)
      eo.n_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / f.workers);
    auto weights = load_model(eo.model_dir);
    if (!weights.ok()) fail(cmd, weights.status());
    if (w == 0) numerics = system_fingerprint(**weights, eo);
    if (eo.topology.wiring == Wiring::mono) {
      auto e = make_engine(eo, *weights);
      if (!e.ok()) fail(cmd, e.status());
      engines.push_back(std::move(*e));
      afd_engines.push_back(nullptr);
    } else {
      auto e = make_afd_engine(eo, *weights);
      if (!e.ok()) fail(cmd, e.status());
      afd_engines.push_back(e->get());
      engines.push_back(std::move(*e));
    }
    auto d = make_drafter(eo, *weights, engines.back().get());
    if (!d.ok()) fail(cmd, d.status());
    drafters.push_back(std::move(*d));
  }
  serve::ServiceOptions so = f.options;
  so.server = f.server();
  so.model_dir = opt.model_dir;
  so.system_fingerprint = numerics;
  so.deterministic = opt.batch_invariant() && opt.ffn_device != "cuda";
  so.scheduler.draft_tokens = opt.speculative.method == SpeculativeMethod::none ? 0 : opt.speculative.draft_tokens;
  so.scheduler.draft_max_batch = opt.speculative.max_batch;
  // In-process bundles' FFN workers (owned by the engines, which the service keeps alive):
  // their afd_ffn_* series join the service's /metrics, labelled ffn="<engine>.<shard>".
  std::vector<serve::FfnWorkerSample> ffn_samples;
  for (size_t i = 0; i < engines.size(); ++i) {
    DataParallelEngine* dp = afd_engines[i];
    if (dp == nullptr) continue;
    for (const auto& wk : dp->bundle().ffn_workers())
      ffn_samples.push_back(
          serve::ffn_worker_sample(*wk, std::to_string(i) + "." + std::to_string(wk->options().index)));
  }
  // The AFD engines' FFN clients: their membership on /metrics and on /admin/ffn.
  std::vector<FfnClient*> clients;
  std::vector<std::string> client_labels;  // worker="<engine>",engine="<its attention engine>"
  for (size_t i = 0; i < engines.size(); ++i) {
    if (DataParallelEngine* dp = afd_engines[i]) {
      const auto cs = dp->bundle().ffn_clients();
      for (size_t k = 0; k < cs.size(); ++k) {
        clients.push_back(cs[k]);
        client_labels.push_back("worker=\"" + std::to_string(i) + "\",engine=\"" +
                                std::to_string(dp->bundle().first_attention_index() + static_cast<int>(k)) + "\"");
      }
    }
  }
  if (!clients.empty()) {
    so.ffn_admin = [clients](const std::string& method, const std::string& body) {
      return serve::ffn_admin_request(clients, method, body);
    };
  }
  if (extras.children) {
    for (auto& e : engines) e = std::make_unique<LossAwareEngine>(std::move(e), extras.children);
  }
  auto svc = serve::Service::create(so, std::move(engines), std::move(drafters));
  if (!svc.ok()) fail(cmd, svc.status());
  if (!ffn_samples.empty()) {
    (*svc)->metrics().add_section([ffn_samples] { return serve::render_ffn_worker_metrics(ffn_samples, now_ns()); });
  }
  if (!clients.empty()) {
    (*svc)->metrics().add_section([clients, client_labels] {
      std::vector<serve::FfnMembershipSample> samples;
      for (size_t i = 0; i < clients.size(); ++i)
        samples.push_back(serve::FfnMembershipSample{client_labels[i], clients[i]->membership()});
      return serve::render_ffn_membership_metrics(samples);
    });
  }
  if (!extras.federate.empty()) {
    (*svc)->metrics().add_section(
        [targets = extras.federate] { return serve::federate_metrics("", targets, 1000, serve::http_scrape_metrics); });
  }
  if (extras.children) {
    (*svc)->metrics().add_section([children = extras.children] { return render_process_metrics(children); });
  }
  if (Status s = (*svc)->start(); !s.is_ok()) fail(cmd, s);
  serve::Service* raw = svc->get();
  auto on_signal = StopOnSignal::start(drain_then_stop(raw, f.drain_timeout_s));
  if (!on_signal.ok()) fail(cmd, on_signal.status());
  std::string b = banner;
  if (size_t at = b.find("{model}"); at != std::string::npos) b.replace(at, 7, raw->model().limits.model_name);
  std::printf("%s on http://%s:%d%s\n", b.c_str(), f.options.server.host.c_str(), raw->port(), suffix.c_str());
  std::fflush(stdout);
  Status s = raw->run();
  on_signal->reset();  // a signal's stop() has finished (the service outlives it)
  raw->stop();
  if (opt.observability.trace && !extras.trace_path.empty()) {
    if (Status ts = write_trace(cmd, *opt.observability.trace, extras.trace_path); !ts.is_ok())
      spdlog::error("afd {}: {}", cmd, ts.to_string());
  }
  if (!s.is_ok()) fail(cmd, s);
  if (extras.exit_on_worker_loss && lost->load()) {
    extras.children->stop_all();  // joins the watcher: lost() is final
    fail(cmd, unavailable("stopped because a worker process is lost (--exit-on-worker-loss): " +
                          extras.children->lost()));
  }
}

void run_frontend(const char* cmd, serve::FrontendOptions fo, int n_ffn, ChildProcesses* children,
                  RestartPolicy restart, double drain_timeout_s, bool exit_on_worker_loss,
                  ServeAutoscaler* autoscaler) {
  const int n_att = static_cast<int>(fo.workers.size());
  const bool reloadable = !fo.topology_file.empty();
  const std::string host = fo.server.host;
  auto model = std::make_shared<std::string>();
  fo.on_all_up = [n_att, n_ffn, host, model, children](int port) {
    if (children) children->mark_ready();  // from now on a worker that exits is restarted
    std::printf("afd serve: bundle complete: %d attention worker%s%s up; model '%s' on http://%s:%d\n", n_att,
                n_att > 1 ? "s" : "",
                n_ffn > 0 ? (" + " + std::to_string(n_ffn) + " FFN worker" + (n_ffn > 1 ? "s" : "")).c_str() : "",
                model->c_str(), host.c_str(), port);
    std::fflush(stdout);
  };
  if (children && children->size() > 0) {
    // The launcher's view of its worker processes, for crash loops that /health alone hides.
    fo.extra_metrics = [children, autoscaler] {
      return render_process_metrics(children) + (autoscaler ? autoscaler->render_metrics() : std::string());
    };
    fo.lost_workers = [children] { return children->lost(); };
  }
  auto f = serve::Frontend::create(std::move(fo));
  if (!f.ok()) fail(cmd, f.status());
  *model = (*f)->model().limits.model_name;
  if (Status s = (*f)->start(); !s.is_ok()) fail(cmd, s);
  serve::Frontend* raw = f->get();
  auto on_signal = StopOnSignal::start(drain_then_stop(raw, drain_timeout_s));
  if (!on_signal.ok()) fail(cmd, on_signal.status());
  // --topology-file without --spawn-workers: SIGHUP re-reads it (serve/frontend/frontend_reload.h).
  std::unique_ptr<ReloadOnHangup> on_hangup;
  if (reloadable) {
    auto h = ReloadOnHangup::start([raw] { raw->reload("SIGHUP"); });
    if (!h.ok()) fail(cmd, h.status());
    on_hangup = std::move(*h);
  }
  // A worker that cannot start (bad model, port taken, ...) fails the whole command. The
  // watcher writes the reason; it is read below only after stop_all() has joined the watcher.
  auto startup_failure = std::make_shared<std::string>();
  auto lost = std::make_shared<std::atomic<bool>>(false);
  if (children)
    children->watch(
        restart,
        [raw, startup_failure](const std::string& why) {
          *startup_failure = why;
          raw->stop();
        },
        [lost, exit_on_worker_loss](const std::string&) {
          lost->store(true);
          if (exit_on_worker_loss) StopOnSignal::request_stop("a worker process is lost (--exit-on-worker-loss)");
        });
  if (autoscaler) autoscaler->start(raw);
  std::printf("afd serve: front end on http://%s:%d for %d attention worker%s (waiting for them)\n", host.c_str(),
              raw->port(), n_att, n_att > 1 ? "s" : "");
  std::fflush(stdout);
  Status s = raw->run();
  on_hangup.reset();
  on_signal->reset();  // a signal's stop() has finished before the front end goes
  if (autoscaler) autoscaler->stop();
  if (children) children->stop_all();  // joins the watcher: no stop() from it after this
  raw->stop();
  f->reset();
  if (!s.is_ok()) fail(cmd, s);
  if (!startup_failure->empty()) fail(cmd, unavailable(*startup_failure));
  if (exit_on_worker_loss && lost->load())
    fail(cmd, unavailable("stopped because a worker process is lost (--exit-on-worker-loss): " + children->lost()));
}

}  // namespace afd::cli
