#include "serve_stack.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "runtime/bundle.h"
#include "runtime/ffn_client.h"
#include "serve/ffn_admin.h"
#include "serve/ffn_metrics.h"
#include "serve/metrics.h"
#include "serve/metrics_federation.h"
#include "trace_output.h"

namespace afd::cli {

namespace {
int g_signal_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  ssize_t r = write(g_signal_pipe[1], &b, 1);
  (void)r;
}
}  // namespace

void ServiceFlags::add_to(CLI::App* cmd, bool public_api) {
  if (public_api) {
    cmd->add_option("--host", host, "Address to bind (127.0.0.1: this machine only)")
        ->envname("AFD_HOST")->capture_default_str();
    cmd->add_option("--port", port, "TCP port (0: any free port)")->envname("AFD_PORT")->capture_default_str();
    cmd->add_option("--api-key", api_key, "Require 'Authorization: Bearer KEY' on /v1/*")->envname("AFD_API_KEY");
    cmd->add_option("--workers", workers, "Data-parallel attention workers (one engine each)")
        ->envname("AFD_WORKERS")->capture_default_str();
  }
  cmd->add_option("--model-name", model_name, "Model id in the API (default: the model directory's name)")
      ->envname("AFD_MODEL_NAME");
  cmd->add_option("--max-running", max_running, "Sequences per batch per worker")
      ->envname("AFD_MAX_RUNNING")->capture_default_str();
  cmd->add_option("--max-queue", max_queue, "Waiting requests per worker before 429")
      ->envname("AFD_MAX_QUEUE")->capture_default_str();
  cmd->add_option("--max-batch-tokens", max_batch_tokens, "Tokens per forward pass (decodes + prefill chunks)")
      ->envname("AFD_MAX_BATCH_TOKENS")->capture_default_str();
  cmd->add_option("--max-context", max_context, "Context limit per request (0: the model's)")
      ->envname("AFD_MAX_CONTEXT")->capture_default_str();
  cmd->add_option("--max-body", max_body, "Request body limit in bytes (413 above)")
      ->envname("AFD_MAX_BODY")->capture_default_str();
  cmd->add_option("--http-threads", http_threads, "Concurrent HTTP connections served")
      ->envname("AFD_HTTP_THREADS")->capture_default_str();
  cmd->add_option("--drain-timeout-s", drain_timeout_s,
                  "On SIGINT/SIGTERM, stop taking requests and let those in flight finish for up to this long (a "
                  "second signal stops at once; 0: stop at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->envname("AFD_DRAIN_TIMEOUT_S")->capture_default_str();
  cmd->add_option("--step-retry-s", step_retry_s,
                  "AFD: when a forward pass fails on a lost or stalled FFN worker, keep its requests and retry it once "
                  "the FFN side is back, for up to this long (0: fail them at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->envname("AFD_STEP_RETRY_S")->capture_default_str();
}

Status ServiceFlags::validate() const {
  if (workers < 1 || workers > 64) return invalid_argument("--workers must be in [1, 64]");
  if (port < 0 || port > 65535) return invalid_argument("--port must be in [0, 65535]");
  if (drain_timeout_s < 0 || step_retry_s < 0) return invalid_argument("--drain-timeout-s and --step-retry-s must be >= 0");
  if (max_running < 1 || max_queue < 0 || max_batch_tokens < 1 || max_body < 1024 || http_threads < 1)
    return invalid_argument("--max-running, --max-batch-tokens, --http-threads must be >= 1, --max-body >= 1024");
  return Status::ok();
}

Result<std::unique_ptr<StopOnSignal>> StopOnSignal::start(StopActions a) {
  // The handler only writes the signal's number to a pipe (async-signal-safe), whichever
  // thread takes the signal (libraries such as OpenBLAS start threads before main, so a
  // blocked-mask + sigwait scheme can miss it); a dedicated thread reads the pipe and runs
  // the actions. A 0 byte (no signal has that number) from the destructor ends the thread.
  if (g_signal_pipe[0] < 0 && pipe(g_signal_pipe) != 0) return io_error("pipe() failed");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::unique_ptr<StopOnSignal> s(new StopOnSignal());
  s->thread_ = std::thread([a = std::move(a)] {
    unsigned char sig = 0;
    if (read(g_signal_pipe[0], &sig, 1) != 1 || sig == 0) return;
    if (a.drain && a.drain_timeout_s > 0) {
      spdlog::info("afd: signal {}: draining (no new requests; up to {} s for those in flight, signal again to stop "
                   "now)",
                   static_cast<int>(sig), a.drain_timeout_s);
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
          spdlog::info("afd: signal {} again, stopping now", static_cast<int>(sig));
          break;
        }
      }
    } else {
      spdlog::info("afd: signal {}, stopping", static_cast<int>(sig));
    }
    a.stop();
  });
  return s;
}

StopOnSignal::~StopOnSignal() {
  const unsigned char end = 0;
  ssize_t r = write(g_signal_pipe[1], &end, 1);
  (void)r;
  if (thread_.joinable()) thread_.join();
}

void run_engine_service(const char* cmd, const ServiceFlags& f, const EngineOptions& opt, const std::string& banner,
                        const std::string& suffix, const ServiceExtras& extras) {
  // Data-parallel attention workers: one engine each, sharing the compute threads.
  std::vector<std::unique_ptr<Engine>> engines;
  for (int w = 0; w < f.workers; ++w) {
    EngineOptions eo = opt;
    if (f.workers > 1 && eo.n_threads == 0)
      eo.n_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / f.workers);
    auto e = make_engine(eo);
    if (!e.ok()) fail(cmd, e.status());
    engines.push_back(std::move(*e));
  }
  serve::ServiceOptions so;
  so.server.host = f.host;
  so.server.port = f.port;
  so.server.api_key = f.api_key;
  so.server.max_body_bytes = static_cast<size_t>(f.max_body);
  so.server.http_threads = f.http_threads;
  so.scheduler.max_running = f.max_running;
  so.scheduler.max_queue = f.max_queue;
  so.scheduler.max_batch_tokens = f.max_batch_tokens;
  so.scheduler.step_retry_s = f.step_retry_s;
  so.model_dir = opt.model_dir;
  so.model_name = f.model_name;
  so.max_context = f.max_context;
  // In-process bundles' FFN workers (owned by the engines, which the service keeps alive):
  // their afd_ffn_* series join the service's /metrics, labelled ffn="<engine>.<shard>".
  std::vector<serve::FfnWorkerSample> ffn_samples;
  for (size_t i = 0; i < engines.size(); ++i) {
    auto* dp = dynamic_cast<DataParallelEngine*>(engines[i].get());
    if (dp == nullptr) continue;
    for (const auto& wk : dp->bundle().ffn_workers())
      ffn_samples.push_back(
          serve::ffn_worker_sample(*wk, std::to_string(i) + "." + std::to_string(wk->options().index)));
  }
  // The AFD engines' FFN clients: their membership on /metrics and on /admin/ffn.
  std::vector<FfnClient*> clients;
  std::vector<std::string> client_labels;  // worker="<engine>",engine="<its attention engine>"
  for (size_t i = 0; i < engines.size(); ++i) {
    if (auto* dp = dynamic_cast<DataParallelEngine*>(engines[i].get())) {
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
  auto svc = serve::Service::create(so, std::move(engines));
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
        [targets = extras.federate] { return serve::federate_metrics("", targets, 1000); });
  }
  if (Status s = (*svc)->start(); !s.is_ok()) fail(cmd, s);
  serve::Service* raw = svc->get();
  auto on_signal = StopOnSignal::start(drain_then_stop(raw, f.drain_timeout_s));
  if (!on_signal.ok()) fail(cmd, on_signal.status());
  std::string b = banner;
  if (size_t at = b.find("{model}"); at != std::string::npos) b.replace(at, 7, raw->model().limits.model_name);
  std::printf("%s on http://%s:%d%s\n", b.c_str(), f.host.c_str(), raw->port(), suffix.c_str());
  std::fflush(stdout);
  Status s = raw->run();
  on_signal->reset();  // a signal's stop() has finished (the service outlives it)
  raw->stop();
  if (opt.trace && !extras.trace_path.empty()) {
    if (Status ts = write_trace(cmd, *opt.trace, extras.trace_path); !ts.is_ok())
      spdlog::error("afd {}: {}", cmd, ts.to_string());
  }
  if (!s.is_ok()) fail(cmd, s);
}

void run_frontend(const char* cmd, serve::FrontendOptions fo, int n_ffn, ChildProcesses* children,
                  RestartPolicy restart, double drain_timeout_s) {
  const int n_att = static_cast<int>(fo.workers.size());
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
    fo.extra_metrics = [children] {
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
      return o;
    };
  }
  auto f = serve::Frontend::create(std::move(fo));
  if (!f.ok()) fail(cmd, f.status());
  *model = (*f)->model().limits.model_name;
  if (Status s = (*f)->start(); !s.is_ok()) fail(cmd, s);
  serve::Frontend* raw = f->get();
  auto on_signal = StopOnSignal::start(drain_then_stop(raw, drain_timeout_s));
  if (!on_signal.ok()) fail(cmd, on_signal.status());
  // A worker that cannot start (bad model, port taken, ...) fails the whole command. The
  // watcher writes the reason; it is read below only after stop_all() has joined the watcher.
  auto startup_failure = std::make_shared<std::string>();
  if (children)
    children->watch(restart, [raw, startup_failure](const std::string& why) {
      *startup_failure = why;
      raw->stop();
    });
  std::printf("afd serve: front end on http://%s:%d for %d attention worker%s (waiting for them)\n", host.c_str(),
              raw->port(), n_att, n_att > 1 ? "s" : "");
  std::fflush(stdout);
  Status s = raw->run();
  on_signal->reset();  // a signal's stop() has finished before the front end goes
  if (children) children->stop_all();  // joins the watcher: no stop() from it after this
  raw->stop();
  f->reset();
  if (!s.is_ok()) fail(cmd, s);
  if (!startup_failure->empty()) fail(cmd, unavailable(*startup_failure));
}

}  // namespace afd::cli
