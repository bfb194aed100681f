// The serving stacks behind `afd serve` and `afd worker --role attention`:
//   run_engine_service — engines + scheduler + HTTP API in this process (in-process serve,
//                         and one attention worker of a multi-process deployment);
//   run_frontend       — the engine-less front end over attention worker processes
//                         (serve::Frontend), optionally with the workers as children.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "child_processes.h"
#include "engine_flags.h"
#include "serve/frontend/frontend.h"
#include "serve/scheduling/service.h"

namespace afd::cli {

class ServeAutoscaler;

// Scheduler and HTTP limits shared by serve and attention workers. A flag that sets a
// ServiceOptions member as it is (--port, --max-running, --step-retry-s, the --http-* limits,
// ...) is bound to that member of `options`, so its default is the one SchedulerOptions,
// ServerOptions, http::Limits or AdmissionOptions has; the members here are this command's.
struct ServiceFlags {
  serve::ServiceOptions options;
  int workers = 1;
  // parse | text (ServerOptions::content_special_as_text)
  std::string content_special_tokens = serve::ServerOptions{}.content_special_as_text ? "text" : "parse";
  // SIGINT/SIGTERM first stop taking requests and let those in flight finish for up to this
  // long (a second signal stops at once); 0: stop at once.
  double drain_timeout_s = 30;

  // public_api: also --host, --port, --api-key, --workers (serve); workers get --listen instead.
  void add_to(CLI::App* cmd, bool public_api);
  Status validate() const;
  // options.server with --content-special-tokens.
  serve::ServerOptions server() const;
};

// What a signal does to a server. With drain_timeout_s > 0 and a drain, the first
// SIGINT/SIGTERM calls drain() (stop taking work), then stop() once drained() is true, the
// timeout has passed, or a second signal came; otherwise the first signal calls stop().
struct StopActions {
  std::function<void()> stop;
  std::function<void()> drain;     // optional; must not block
  std::function<bool()> drained;   // with drain
  double drain_timeout_s = 0;
};

// Drain-then-stop for a server with stop(), drain() and drained() (serve::Service,
// serve::Frontend), which must outlive the StopOnSignal.
template <class Server>
StopActions drain_then_stop(Server* s, double drain_timeout_s) {
  return StopActions{[s] { s->stop(); }, [s] { s->drain(); }, [s] { return s->drained(); }, drain_timeout_s};
}

// Runs StopActions from a dedicated thread (the handler only writes to a pipe). Destroying
// the object waits for a stop() in progress and rules out a later one, so whatever the
// actions touch may be destroyed after it. One at a time per process.
class StopOnSignal {
 public:
  static Result<std::unique_ptr<StopOnSignal>> start(StopActions actions);
  // Acts as a first SIGTERM would (drain, then stop; a signal after it stops at once),
  // logging `why`. Async-safe enough for any thread (a pipe write); before start() it takes
  // effect once start() runs. Used for --exit-on-worker-loss.
  static void request_stop(const std::string& why);
  ~StopOnSignal();

 private:
  StopOnSignal() = default;
  std::thread thread_;
};

// What run_engine_service adds to a plain service.
struct ServiceExtras {
  // Their series join the service's /metrics, fetched per scrape (e.g. FFN worker child
  // processes; serve/metrics/metrics_federation.h).
  std::vector<serve::MetricsTarget> federate;
  // With opt.trace: the pipeline trace is written here when the service stops.
  std::string trace_path;
  // Worker processes this command started (--spawn-ffn), watched once the service runs:
  // restarted as `restart` says; their afd_frontend_process_* series join /metrics; one that
  // is lost (ChildProcesses::lost) makes /health 503 naming it, and with
  // exit_on_worker_loss drains and stops the service, which then fails (exit status 1).
  ChildProcesses* children = nullptr;
  RestartPolicy restart;
  bool exit_on_worker_loss = false;
};

// Builds f.workers engines from `opt` and serves them until a signal. Once the API listens,
// prints (stdout) "<banner> on http://HOST:PORT<suffix>", "{model}" in banner replaced by the
// served model id.
void run_engine_service(const char* cmd, const ServiceFlags& f, const EngineOptions& opt, const std::string& banner,
                        const std::string& suffix, const ServiceExtras& extras = {});

// Serves the front end over `fo.workers` until a signal; prints the front end's address,
// then "afd serve: bundle complete: ..." once every attention worker answers /health.
// `children` (may be null) are the locally spawned workers, restarted as `restart` says when
// they exit, and stopped on exit. One that is lost (restarts exhausted or off) makes the
// front end's /health 503 naming it; with exit_on_worker_loss the front end then drains and
// stops and the command fails (exit status 1), for a supervisor to restart the bundle.
// drain_timeout_s: StopActions::drain_timeout_s (the front end drains before it stops the
// children, so they stop idle).
// autoscaler (may be null): started over the front end once it listens, stopped before the
// children are.
void run_frontend(const char* cmd, serve::FrontendOptions fo, int n_ffn, ChildProcesses* children,
                  RestartPolicy restart = {}, double drain_timeout_s = 0, bool exit_on_worker_loss = false,
                  ServeAutoscaler* autoscaler = nullptr);

// The afd_frontend_process_* series of the worker processes in `children`.
std::string render_process_metrics(ChildProcesses* children);

}  // namespace afd::cli
