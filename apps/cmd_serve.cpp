// afd serve: the OpenAI-compatible HTTP API (docs/SERVING.md).
#include <csignal>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <pthread.h>
#include <thread>

#include "commands.h"
#include "core/log.h"
#include "engine_flags.h"
#include "local_ffn.h"
#include "serve/service.h"

namespace afd::cli {

namespace {

struct ServeFlags {
  EngineFlags engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string model_name;
  int workers = 1;
  int64_t max_running = 64;
  int64_t max_queue = 1024;
  int64_t max_batch_tokens = 1024;
  int64_t max_context = 0;
  int64_t max_body = 1 << 20;
  int http_threads = 512;
};

int g_signal_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  ssize_t r = write(g_signal_pipe[1], &b, 1);
  (void)r;
}

void run_serve(const ServeFlags& f) {
  if (f.workers < 1 || f.workers > 64) fail("serve", invalid_argument("--workers must be in [1, 64]"));
  if (f.port < 0 || f.port > 65535) fail("serve", invalid_argument("--port must be in [0, 65535]"));
  if (f.max_running < 1 || f.max_queue < 0 || f.max_batch_tokens < 1 || f.max_body < 1024 || f.http_threads < 1)
    fail("serve", invalid_argument("--max-running, --max-batch-tokens, --http-threads must be >= 1, --max-body >= 1024"));
  // SIGINT/SIGTERM: the handler only writes a byte to a pipe (async-signal-safe), whichever
  // thread takes the signal (libraries such as OpenBLAS start threads before main, so a
  // blocked-mask + sigwait scheme can miss it); a dedicated thread reads the pipe and stops
  // the server.
  if (pipe(g_signal_pipe) != 0) fail("serve", io_error("pipe() failed"));
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto opt = f.engine.to_options();
  if (!opt.ok()) fail("serve", opt.status());
  if (!std::filesystem::is_directory(opt->model_dir))
    fail("serve", not_found("model directory '" + opt->model_dir +
                            "' does not exist (create one: afd make-model --preset tiny --out " + opt->model_dir + ")"));
  // --spawn-ffn: the topology's FFN workers as child processes (outlive the engines).
  if (f.engine.spawn_ffn && f.workers != 1)
    fail("serve", invalid_argument("--spawn-ffn hosts the topology's attention workers itself; use --workers 1"));
  LocalFfnProcesses ffn_procs;
  if (Status s = ffn_procs.start(f.engine, &*opt); !s.is_ok()) fail("serve", s);
  // Data-parallel attention workers: one engine each, sharing the compute threads.
  std::vector<std::unique_ptr<Engine>> engines;
  for (int w = 0; w < f.workers; ++w) {
    EngineOptions eo = *opt;
    if (f.workers > 1 && eo.n_threads == 0)
      eo.n_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / f.workers);
    auto e = make_engine(eo);
    if (!e.ok()) fail("serve", e.status());
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
  so.model_dir = opt->model_dir;
  so.model_name = f.model_name;
  so.max_context = f.max_context;
  auto svc = serve::Service::create(so, std::move(engines));
  if (!svc.ok()) fail("serve", svc.status());

  if (Status s = (*svc)->start(); !s.is_ok()) fail("serve", s);
  serve::Service* raw = svc->get();
  std::thread sig_thread([raw] {
    unsigned char sig = 0;
    if (read(g_signal_pipe[0], &sig, 1) == 1) {
      spdlog::info("afd serve: signal {}, stopping", static_cast<int>(sig));
      raw->stop();
    }
  });
  sig_thread.detach();
  std::printf("afd serve: model '%s' on http://%s:%d (%d worker%s)%s\n", raw->model().limits.model_name.c_str(),
              f.host.c_str(), raw->port(), f.workers, f.workers > 1 ? "s" : "",
              f.api_key.empty() ? "" : ", API key required");
  std::fflush(stdout);
  Status s = raw->run();
  raw->stop();
  if (!s.is_ok()) fail("serve", s);
}

}  // namespace

void register_serve(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, streaming)");
  f->engine.model_dir = "models/tiny";
  f->engine.add_to(cmd, /*model_required=*/false);
  cmd->add_option("--host", f->host, "Address to bind (127.0.0.1: this machine only)")
      ->envname("AFD_HOST")->capture_default_str();
  cmd->add_option("--port", f->port, "TCP port (0: any free port)")->envname("AFD_PORT")->capture_default_str();
  cmd->add_option("--api-key", f->api_key, "Require 'Authorization: Bearer KEY' on /v1/*")->envname("AFD_API_KEY");
  cmd->add_option("--model-name", f->model_name, "Model id in the API (default: the model directory's name)")
      ->envname("AFD_MODEL_NAME");
  cmd->add_option("--workers", f->workers, "Data-parallel attention workers (one engine each)")
      ->envname("AFD_WORKERS")->capture_default_str();
  cmd->add_option("--max-running", f->max_running, "Sequences per batch per worker")
      ->envname("AFD_MAX_RUNNING")->capture_default_str();
  cmd->add_option("--max-queue", f->max_queue, "Waiting requests per worker before 429")
      ->envname("AFD_MAX_QUEUE")->capture_default_str();
  cmd->add_option("--max-batch-tokens", f->max_batch_tokens, "Tokens per forward pass (decodes + prefill chunks)")
      ->envname("AFD_MAX_BATCH_TOKENS")->capture_default_str();
  cmd->add_option("--max-context", f->max_context, "Context limit per request (0: the model's)")
      ->envname("AFD_MAX_CONTEXT")->capture_default_str();
  cmd->add_option("--max-body", f->max_body, "Request body limit in bytes (413 above)")
      ->envname("AFD_MAX_BODY")->capture_default_str();
  cmd->add_option("--http-threads", f->http_threads, "Concurrent HTTP connections served")
      ->envname("AFD_HTTP_THREADS")->capture_default_str();
  cmd->callback([f] { run_serve(*f); });
}

}  // namespace afd::cli
