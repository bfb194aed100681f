#include "bench_e2e.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/stats.h"
#include "engine_flags.h"
#include "runtime/generate.h"
#include "runtime/speculative.h"

namespace afd::cli {

void run_bench_e2e(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights, const E2eSpec& spec) {
  const ModelConfig& mc = weights->config;
  // Empty prompts and ids outside the vocabulary are refused by generate() and the engine.
  int64_t longest = spec.prompts.empty() ? spec.prompt_len : 0;
  for (const auto& p : spec.prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  const int64_t need = longest + spec.tokens + 2;
  if (mc.max_position_embeddings > 0 && need > mc.max_position_embeddings)
    fail("bench", out_of_range("the prompt + --tokens (" + std::to_string(longest + spec.tokens) +
                               ") exceed max_position_embeddings " + std::to_string(mc.max_position_embeddings)));
  nlohmann::json rows = nlohmann::json::array();
  if (!spec.json) {
    if (spec.prompts.empty())
      std::printf("end to end: %lld-token prompts, %lld new tokens each (EOS ignored), temperature %.2f\n",
                  (long long)spec.prompt_len, (long long)spec.tokens, spec.temperature);
    else
      std::printf("end to end: %zu prompts from the file (up to %lld tokens), %lld new tokens each (EOS ignored), "
                  "temperature %.2f\n",
                  spec.prompts.size(), (long long)longest, (long long)spec.tokens, spec.temperature);
    if (opt.speculative.method != SpeculativeMethod::none)
      std::printf("speculative decoding: %s, %lld drafts per step\n", speculative_method_name(opt.speculative.method),
                  (long long)opt.speculative.draft_tokens);
    std::printf("%-6s %5s %6s %10s %11s %11s %9s %9s %9s %9s %8s %8s %8s\n", "wiring", "round", "batch", "prefill_s",
                "prefill_t/s", "decode_t/s", "step_ms", "p90_ms", "p99_ms", "max_ms", "p90/med", "accept", "tok/step");
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
        if (!spec.prompts.empty()) {
          const int64_t n = static_cast<int64_t>(spec.prompts.size());
          const int64_t first = (round + salt) * batch;  // timed runs: round r takes the r-th batch of prompts
          for (int64_t i = 0; i < batch; ++i) prompts[i] = spec.prompts[static_cast<size_t>((first + i) % n)];
          return prompts;
        }
        for (int64_t i = 0; i < batch; ++i)
          for (int64_t j = 0; j < spec.prompt_len; ++j)
            prompts[i].push_back(static_cast<int32_t>((i * 7919 + j * 104729 + 13 + salt * 31) % mc.vocab_size));
        return prompts;
      };
      auto drafter = make_drafter(o, weights, eng->get());
      if (!drafter.ok()) fail("bench", drafter.status());
      GenerateOptions g;
      g.drafter = drafter->get();
      g.draft_tokens = *drafter ? o.speculative.draft_tokens : 0;
      g.draft_max_batch = o.speculative.max_batch;
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
      const auto prompts = make_prompts(0);
      auto res = generate(**eng, prompts, g);
      if (!res.ok()) fail("bench", res.status());
      const SampleSummary st = summarize(res->decode_step_s);
      // Tokens after each sequence's first (which prefill yields); none stops early: EOS is ignored.
      int64_t decoded = 0, prompt_tokens = 0;
      for (const auto& t : res->tokens) decoded += static_cast<int64_t>(t.size()) - 1;
      for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
      const double decode_tps = res->decode_s > 0 ? static_cast<double>(decoded) / res->decode_s : 0;
      const double prefill_tps = res->prefill_s > 0 ? static_cast<double>(prompt_tokens) / res->prefill_s : 0;
      const SpeculativeStats& sp = res->speculative;
      const double accept = sp.drafts_proposed > 0 ? static_cast<double>(sp.drafts_accepted) / sp.drafts_proposed : 0;
      // Tokens per sequence per step: decoded tokens over the sequence-steps that made them.
      const int64_t seq_steps = sp.steps + (decoded - sp.tokens_emitted);
      const double per_step = seq_steps > 0 ? static_cast<double>(decoded) / static_cast<double>(seq_steps) : 0;
      nlohmann::json spec_json = {{"method", speculative_method_name(o.speculative.method)},
                                  {"draft_tokens", g.draft_tokens},
                                  {"verifications", sp.steps},
                                  {"drafts_proposed", sp.drafts_proposed},
                                  {"drafts_accepted", sp.drafts_accepted},
                                  {"acceptance", accept},
                                  {"proposed_by_position", sp.proposed_at},
                                  {"accepted_by_position", sp.accepted_at},
                                  {"tokens_per_sequence_step", per_step}};
      nlohmann::json steps = nlohmann::json::array();
      for (double t : res->decode_step_s) steps.push_back(t * 1e3);
      rows.push_back({{"wiring", o.topology.to_string()},
                      {"round", round},
                      {"batch", batch},
                      {"prompt_len", spec.prompts.empty() ? spec.prompt_len : longest},
                      {"decoded_tokens", decoded},
                      {"speculative", spec_json},
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
        std::printf("%-6s %5d %6lld %10.3f %11.1f %11.1f %9.2f %9.2f %9.2f %9.2f %8.3f %8.3f %8.3f\n",
                    o.topology.to_string().c_str(), round, (long long)batch, res->prefill_s, prefill_tps, decode_tps,
                    st.median * 1e3, st.p90 * 1e3, st.p99 * 1e3, st.max * 1e3, st.median > 0 ? st.p90 / st.median : 0.0,
                    accept, per_step);
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
