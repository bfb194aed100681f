// afd worker --role ffn: one FFN worker process of an AFD deployment, over UCX.
// Attention workers (`afd serve|generate|bench --ffn host:port,...`) connect to it in any
// order; it serves until SIGINT/SIGTERM, surviving peers that die or misbehave.
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "commands.h"
#include "comm/ucx_transport.h"
#include "core/log.h"
#include "engine_flags.h"
#include "model/weights.h"
#include "runtime/ffn_worker.h"
#include "runtime/topology.h"

namespace afd::cli {

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }

struct WorkerFlags {
  std::string role = "ffn";
  std::string model_dir;
  std::string listen = "127.0.0.1:7100";
  std::string shard = "0/1";
  int n_attention = 1;
  std::string precision = "fast";
  int threads = 0;
  int peer_timeout_ms = 10000;
};

void run_worker(const WorkerFlags& f) {
  if (f.role != "ffn")
    fail("worker", invalid_argument("--role '" + f.role +
                                    "': only 'ffn' runs as its own process; attention workers are hosted by "
                                    "`afd serve|generate|bench --ffn host:port,...`"));
  int shard = 0, n_shards = 1;
  Status s = parse_shard(f.shard, &shard, &n_shards);
  if (!s.is_ok()) fail("worker", s);
  Precision prec;
  if (!precision_from_name(f.precision, &prec)) fail("worker", invalid_argument("--precision: reference | fast"));
  if (f.n_attention < 1 || f.n_attention > 64) fail("worker", invalid_argument("--attention must be in [1, 64]"));
  auto w = load_model(f.model_dir);
  if (!w.ok()) fail("worker", w.status());

  comm::UcxOptions uo;
  uo.name = "ffn" + std::to_string(shard);
  auto t = comm::UcxTransport::create(uo);
  if (!t.ok()) fail("worker", t.status());
  s = (*t)->listen(f.listen);
  if (!s.is_ok()) fail("worker", s);
  FfnWorkerOptions fo;
  fo.index = shard;
  fo.n_ffn = n_shards;
  fo.n_attention = f.n_attention;
  fo.prec = prec == Precision::reference ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
  fo.peer_timeout_ms = f.peer_timeout_ms;
  ThreadPool pool(f.threads);
  auto worker = FfnWorker::create(*w, t->get(), fo, &pool);
  if (!worker.ok()) fail("worker", worker.status());
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  spdlog::info("ffn worker {}/{} listening on {} for {} attention worker(s)", shard, n_shards, f.listen, f.n_attention);
  s = (*worker)->run(&g_stop);
  (*t)->close();
  if (!s.is_ok()) fail("worker", s);
  const auto& st = (*worker)->stats();
  spdlog::info("ffn worker {} stopped: {} batches, {} tokens, {} bad frames", shard, st.batches.load(),
               st.tokens.load(), st.bad_frames.load());
}

}  // namespace

void register_worker(CLI::App& app) {
  auto f = std::make_shared<WorkerFlags>();
  auto* cmd = app.add_subcommand("worker", "Run one FFN worker process of an AFD deployment (UCX)");
  cmd->add_option("--role", f->role, "ffn")->envname("AFD_ROLE");
  cmd->add_option("--model", f->model_dir, "Model directory (HF layout)")->required()->envname("AFD_MODEL");
  cmd->add_option("--listen", f->listen, "host:port to accept attention workers on")->envname("AFD_LISTEN");
  cmd->add_option("--shard", f->shard, "This worker's expert shard i/y (experts [i*E/y, (i+1)*E/y))")
      ->envname("AFD_SHARD");
  cmd->add_option("--attention", f->n_attention, "Attention workers in the deployment (x of xAyF)")
      ->envname("AFD_N_ATTENTION");
  cmd->add_option("--precision", f->precision, "reference | fast")->envname("AFD_PRECISION");
  cmd->add_option("--threads", f->threads, "Compute threads (0: all cores)")->envname("AFD_THREADS");
  cmd->add_option("--peer-timeout-ms", f->peer_timeout_ms, "Wait for a mid-step attention worker this long")
      ->envname("AFD_PEER_TIMEOUT_MS");
  cmd->callback([f] { run_worker(*f); });
}

}  // namespace afd::cli
