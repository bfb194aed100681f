// afd generate: batched generation from token ids; prints generated ids, one line per prompt.
#include <cstdio>
#include <fstream>
#include <memory>

#include "commands.h"
#include "engine_flags.h"
#include "local_ffn.h"
#include "trace_output.h"
#include "core/stats.h"
#include "model/weights.h"
#include "runtime/generate.h"

namespace afd::cli {

namespace {
struct GenerateFlags {
  EngineFlags engine;
  std::vector<std::string> prompts;
  int64_t max_tokens = 32;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  std::string dump_logits;
};

void run_generate(const GenerateFlags& f) {
  auto opt = f.engine.to_options();
  if (!opt.ok()) fail("generate", opt.status());
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : f.prompts) {
    auto ids = parse_id_list(p);
    if (!ids.ok()) fail("generate", ids.status());
    prompts.push_back(std::move(*ids));
  }
  LocalFfnProcesses ffn_procs;  // outlives the engine (declared first)
  if (Status s = ffn_procs.start(f.engine, &*opt); !s.is_ok()) fail("generate", s);
  auto weights = load_model(opt->model_dir);
  if (!weights.ok()) fail("generate", weights.status());
  auto engine = make_engine(*opt, *weights);
  if (!engine.ok()) fail("generate", engine.status());

  auto drafter = make_drafter(*opt, *weights, engine->get());
  if (!drafter.ok()) fail("generate", drafter.status());

  GenerateOptions g;
  g.drafter = drafter->get();
  g.draft_tokens = *drafter ? opt->speculative.draft_tokens : 0;
  g.draft_max_batch = opt->speculative.max_batch;
  g.max_new_tokens = f.max_tokens;
  g.sampling.temperature = f.temperature;
  g.sampling.top_p = f.top_p;
  g.sampling.top_k = f.top_k;
  g.sampling.seed = f.seed;
  g.stop_at_eos = !f.ignore_eos;
  g.keep_logits = !f.dump_logits.empty();
  auto res = generate(**engine, prompts, g);
  if (!res.ok()) fail("generate", res.status());

  for (const auto& toks : res->tokens) {
    for (size_t i = 0; i < toks.size(); ++i) std::printf(i ? ",%d" : "%d", toks[i]);
    std::printf("\n");
  }
  if (!f.dump_logits.empty()) {
    std::ofstream out(f.dump_logits, std::ios::binary);
    for (const auto& rows : res->logits)
      out.write(reinterpret_cast<const char*>(rows.data()), static_cast<std::streamsize>(rows.size() * 4));
    if (!out) fail("generate", io_error("cannot write logits to " + f.dump_logits));
  }
  if (opt->observability.trace) {
    if (Status ts = write_trace("generate", *opt->observability.trace, f.engine.trace); !ts.is_ok()) fail("generate", ts);
    if (Status ts = ffn_procs.merge_traces("generate", f.engine.trace); !ts.is_ok()) fail("generate", ts);
  }
  int64_t gen = 0;
  for (const auto& t : res->tokens) gen += static_cast<int64_t>(t.size());
  const SampleSummary st = summarize(res->decode_step_s);
  std::fprintf(stderr,
               "afd generate: %zu prompts, %lld tokens; prefill %.3f s, decode %.3f s (%lld steps, %.1f tok/s); "
               "decode step ms median %.2f p90 %.2f p99 %.2f max %.2f\n",
               prompts.size(), static_cast<long long>(gen), res->prefill_s, res->decode_s,
               static_cast<long long>(res->decode_steps),
               res->decode_s > 0 ? (gen - static_cast<double>(prompts.size())) / res->decode_s : 0.0, st.median * 1e3,
               st.p90 * 1e3, st.p99 * 1e3, st.max * 1e3);
  if (const SpeculativeStats& sp = res->speculative; sp.steps > 0)
    std::fprintf(stderr,
                 "afd generate: speculative %s: %lld drafts proposed, %lld accepted (%.1f %%), %.2f tokens per "
                 "verification\n",
                 speculative_method_name(opt->speculative.method), static_cast<long long>(sp.drafts_proposed),
                 static_cast<long long>(sp.drafts_accepted),
                 100.0 * static_cast<double>(sp.drafts_accepted) / static_cast<double>(std::max<int64_t>(1, sp.drafts_proposed)),
                 static_cast<double>(sp.tokens_emitted) / static_cast<double>(sp.steps));
}
}  // namespace

void register_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  auto* cmd = app.add_subcommand("generate", "Generate tokens from prompt token ids");
  f->engine.add_to(cmd);
  cmd->add_option("--prompt-ids", f->prompts, "Comma-separated token ids; repeat for a batch")->required();
  cmd->add_option("--max-tokens", f->max_tokens, "New tokens per prompt");
  cmd->add_option("--temperature", f->temperature, "0 = greedy");
  cmd->add_option("--top-p", f->top_p, "Nucleus mass in (0, 1]");
  cmd->add_option("--top-k", f->top_k, "0 = no limit");
  cmd->add_option("--seed", f->seed, "Sampling seed (prompt i uses seed + i)");
  cmd->add_flag("--ignore-eos", f->ignore_eos, "Do not stop at EOS");
  cmd->add_option("--dump-logits", f->dump_logits,
                  "Write float32 logits rows: per prompt, every prompt position then every generated step");
  cmd->callback([f] { run_generate(*f); });
}

}  // namespace afd::cli
