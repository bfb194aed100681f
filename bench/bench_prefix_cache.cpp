// Prefix caching on a shared-system-prompt workload: the same requests through the real
// Scheduler + engine with the prefix cache on and off, in one run.
//
// Workload: R requests = (S-token system prompt shared by all) + (U unique tokens), each
// generating M tokens greedily, issued by C closed-loop clients (a client submits its next
// request when the previous one finished). Reported per setting: TTFT (scheduler arrival
// -> first token) mean / p50 / p90, prefill tokens forwarded, prefix-cache hits, wall time.
//
// Usage: bench_prefix_cache [--preset small] [--requests 32] [--clients 4] [--system 512]
//                           [--user 32] [--max-tokens 8] [--threads 0]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/timer.h"
#include "model/tools/make_model.h"
#include "model/weights.h"
#include "runtime/engine_factory.h"
#include "serve/scheduling/scheduler.h"
#include "serve/text/tokenizer.h"
#include "serve/text/tokenizer_writer.h"

using namespace afd;
using namespace afd::serve;

namespace {

struct Args {
  std::string preset = "small";
  int requests = 32, clients = 4, system = 512, user = 32, max_tokens = 8, threads = 0;
};

struct Result_ {
  std::vector<double> ttft;
  int64_t prefill = 0, hits = 0, queries = 0, prompt = 0;
  double wall = 0;
  std::vector<std::vector<int32_t>> outputs;
};

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

Result_ run(const Args& a, const std::string& dir, const Tokenizer* tok, bool caching) {
  EngineOptions o;
  o.model_dir = dir;
  o.precision = Precision::fast;
  o.kv.capacity_tokens = 65536;
  o.kv.max_seqs = 64;
  o.n_threads = a.threads;
  o.kv.prefix_caching = caching;
  auto w = load_model(dir);
  if (!w.ok()) {
    std::fprintf(stderr, "model: %s\n", w.status().to_string().c_str());
    std::exit(1);
  }
  auto e = make_engine(o, *w);
  if (!e.ok()) {
    std::fprintf(stderr, "engine: %s\n", e.status().to_string().c_str());
    std::exit(1);
  }
  Metrics metrics(1);
  SchedulerOptions so;
  so.max_running = a.clients;
  so.max_batch_tokens = 1024;
  Scheduler sched(e->get(), so, &metrics.worker(0), &metrics);
  sched.start();
  const int32_t vocab = static_cast<int32_t>((*e)->config().vocab_size);
  std::vector<int32_t> system(static_cast<size_t>(a.system));
  for (int i = 0; i < a.system; ++i) system[i] = 3 + (i * 7919) % (vocab - 3);
  Result_ res;
  res.ttft.resize(static_cast<size_t>(a.requests));
  res.outputs.resize(static_cast<size_t>(a.requests));
  std::atomic<int> next{0};
  const double t0 = now_s();
  std::vector<std::thread> clients;
  for (int c = 0; c < a.clients; ++c) {
    clients.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < a.requests;) {
        GenerationRequest g;
        g.prompt = system;
        for (int k = 0; k < a.user; ++k) g.prompt.push_back(3 + (i * 104729 + k * 31 + 17) % (vocab - 3));
        g.max_tokens = a.max_tokens;
        g.ignore_eos = true;
        g.sampling.temperature = 0;
        auto r = std::make_shared<SeqRequest>(g, tok, std::vector<int32_t>{}, now_s());
        if (!sched.submit(r).is_ok()) std::exit(1);
        for (bool done = false; !done;) {
          for (StreamEvent& ev : r->channel->wait(std::chrono::milliseconds(100))) {
            for (auto& t : ev.tokens) res.outputs[i].push_back(t.token);
            if (ev.finish != FinishReason::none) {
              if (ev.finish != FinishReason::length) {
                std::fprintf(stderr, "request %d failed: %s\n", i, ev.error.to_string().c_str());
                std::exit(1);
              }
              done = true;
            }
          }
        }
        res.ttft[i] = r->t_first - r->t_arrival;
      }
    });
  }
  for (auto& t : clients) t.join();
  res.wall = now_s() - t0;
  sched.stop();
  res.prefill = metrics.prefill_tokens.load();
  res.hits = metrics.prefix_cache_hits.load();
  res.queries = metrics.prefix_cache_queries.load();
  res.prompt = metrics.prompt_tokens.load();
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (argc % 2 == 0) {  // flags come in pairs; a lone one (--help too) gets the usage
    std::fprintf(stderr,
                 "usage: bench_prefix_cache [--preset P] [--requests N] [--clients N] [--system TOKENS] [--user TOKENS] "
                 "[--max-tokens N] [--threads N]\n");
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--preset") a.preset = v;
    else if (k == "--requests") a.requests = std::atoi(v.c_str());
    else if (k == "--clients") a.clients = std::atoi(v.c_str());
    else if (k == "--system") a.system = std::atoi(v.c_str());
    else if (k == "--user") a.user = std::atoi(v.c_str());
    else if (k == "--max-tokens") a.max_tokens = std::atoi(v.c_str());
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (a.requests <= 0 || a.clients <= 0 || a.system <= 0 || a.user <= 0 || a.max_tokens <= 0) {
    std::fprintf(stderr, "--requests, --clients, --system, --user, --max-tokens must be positive\n");
    return 2;
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("afd_bench_prefix_" + std::to_string(::getpid()))).string();
  auto cfg = make_preset_config(Arch::qwen3_moe, a.preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().to_string().c_str());
    return 2;
  }
  MakeModelOptions mo;
  mo.out_dir = dir;
  auto made = make_model(*cfg, mo);
  auto tw = write_tokenizer_files(dir, cfg->vocab_size);
  auto tok = Tokenizer::load(dir + "/tokenizer.json");
  if (!made.ok() || !tw.ok() || !tok.ok()) {
    std::fprintf(stderr, "model/tokenizer setup failed\n");
    return 1;
  }
  std::printf("preset %s, %d requests (%d-token shared system prompt + %d unique tokens, %d generated), %d clients\n",
              a.preset.c_str(), a.requests, a.system, a.user, a.max_tokens, a.clients);
  std::printf("| prefix cache | TTFT mean / p50 / p90 (ms) | prefill tokens forwarded | cache hits / queried tokens | wall (s) |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  std::vector<std::vector<int32_t>> first_outputs;
  for (bool caching : {false, true}) {
    Result_ r = run(a, dir, tok->get(), caching);
    double mean = 0;
    for (double t : r.ttft) mean += t;
    mean /= static_cast<double>(r.ttft.size());
    std::printf("| %s | %.1f / %.1f / %.1f | %lld of %lld prompt | %lld / %lld | %.2f |\n", caching ? "on" : "off",
                mean * 1e3, pct(r.ttft, 0.5) * 1e3, pct(r.ttft, 0.9) * 1e3, static_cast<long long>(r.prefill),
                static_cast<long long>(r.prompt), static_cast<long long>(r.hits), static_cast<long long>(r.queries),
                r.wall);
    if (first_outputs.empty()) first_outputs = r.outputs;
    else {
      int same = 0;
      for (size_t i = 0; i < r.outputs.size(); ++i) same += r.outputs[i] == first_outputs[i];
      std::printf("greedy outputs identical to cache off: %d of %zu requests (fast precision: bf16 rounding may differ)\n",
                  same, r.outputs.size());
    }
  }
  std::filesystem::remove_all(dir);
  return 0;
}
