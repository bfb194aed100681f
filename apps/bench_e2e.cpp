#include "bench_e2e.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/stats.h"
#include "engine_flags.h"
#include "runtime/generate.h"

namespace afd::cli {

void run_bench_e2e(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights, const E2eSpec& spec) {
  const ModelConfig& mc = weights->config;
  const int64_t need = spec.prompt_len + spec.tokens + 2;
  if (mc.max_position_embeddings > 0 && need > mc.max_position_embeddings)
    fail("bench", out_of_range("--prompt-len + --tokens (" + std::to_string(spec.prompt_len + spec.tokens) +
                               ") exceed max_position_embeddings " + std::to_string(mc.max_position_embeddings)));
  nlohmann::json rows = nlohmann::json::array();
  if (!spec.json) {
    std::printf("end to end: %lld-token prompts, %lld new tokens each (EOS ignored), temperature %.2f\n",
                (long long)spec.prompt_len, (long long)spec.tokens, spec.temperature);
    std::printf("%-6s %5s %6s %10s %11s %11s %9s %9s %9s %9s %8s\n", "wiring", "round", "batch", "prefill_s",
                "prefill_t/s", "decode_t/s", "step_ms", "p90_ms", "p99_ms", "max_ms", "p90/med");
  }
  for (int round = 0; round < spec.rounds; ++round) {
    for (int64_t batch : spec.batches) {
      EngineOptions o = opt;
      o.kv.max_seqs = batch;
      const int64_t blk = o.kv.block_size;
      o.kv.capacity_tokens = batch * ((need + blk - 1) / blk * blk);
      auto eng = make_engine(o, weights);
      if (!eng.ok()) fail("bench", eng.status());
      auto make_prompts = [&](int64_t salt) {
        std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
        for (int64_t i = 0; i < batch; ++i)
          for (int64_t j = 0; j < spec.prompt_len; ++j)
            prompts[i].push_back(static_cast<int32_t>((i * 7919 + j * 104729 + 13 + salt * 31) % mc.vocab_size));
        return prompts;
      };
      GenerateOptions g;
      g.max_new_tokens = spec.tokens;
      g.stop_at_eos = false;
      g.sampling.temperature = spec.temperature;
      g.sampling.seed = 1;
      // Warm-up: the engine's buffers and its pool threads' scratch are touched once, as in a
      // server that has answered a request before (the timed prompt differs from these).
      for (int w = 0; w < spec.warmup; ++w) {
        auto warm = generate(**eng, make_prompts(w + 1), g);
        if (!warm.ok()) fail("bench", warm.status());
      }
      auto res = generate(**eng, make_prompts(0), g);
      if (!res.ok()) fail("bench", res.status());
      const SampleSummary st = summarize(res->decode_step_s);
      // Every decode step yields one token per sequence (none stops early: EOS is ignored).
      const double decode_tps = res->decode_s > 0 ? static_cast<double>(batch * res->decode_steps) / res->decode_s : 0;
      const double prefill_tps = res->prefill_s > 0 ? static_cast<double>(batch * spec.prompt_len) / res->prefill_s : 0;
      nlohmann::json steps = nlohmann::json::array();
      for (double t : res->decode_step_s) steps.push_back(t * 1e3);
      rows.push_back({{"wiring", o.topology.to_string()},
                      {"round", round},
                      {"batch", batch},
                      {"prompt_len", spec.prompt_len},
                      {"new_tokens", spec.tokens},
                      {"prefill_s", res->prefill_s},
                      {"prefill_tokens_per_s", prefill_tps},
                      {"decode_tokens_per_s", decode_tps},
                      {"step_ms", st.median * 1e3},
                      {"step_ms_p90", st.p90 * 1e3},
                      {"step_ms_p99", st.p99 * 1e3},
                      {"step_ms_max", st.max * 1e3},
                      {"step_ms_mean", st.mean * 1e3},
                      {"step_times_ms", steps}});
      if (!spec.json) {
        std::printf("%-6s %5d %6lld %10.3f %11.1f %11.1f %9.2f %9.2f %9.2f %9.2f %8.3f\n", o.topology.to_string().c_str(), round,
                    (long long)batch, res->prefill_s, prefill_tps, decode_tps, st.median * 1e3, st.p90 * 1e3,
                    st.p99 * 1e3, st.max * 1e3, st.median > 0 ? st.p90 / st.median : 0.0);
        std::fflush(stdout);
      }
    }
  }
  if (spec.json) {
    nlohmann::json out = {{"mode", "e2e"}, {"rows", rows}};
    std::printf("%s\n", out.dump(2).c_str());
  }
}

}  // namespace afd::cli
