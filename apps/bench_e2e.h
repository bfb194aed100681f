// afd bench --e2e: end-to-end generation through the real generate loop (prefill, sampling,
// KV growth), the decode step times a user sees.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/weights.h"
#include "runtime/engine_factory.h"

namespace afd::cli {

struct E2eSpec {
  std::vector<int64_t> batches;  // one run per batch size (sequences generated together)
  int64_t tokens = 64;           // new tokens per sequence (EOS ignored)
  int64_t prompt_len = 128;      // prompt tokens per sequence (deterministic ids)
  float temperature = 0.0f;
  int rounds = 1;                // every batch size this many times, one after the other
  bool json = false;
  int warmup = 0;  // untimed generate calls on each round's engine before the timed one (other prompt ids)
  // When not empty (--prompt-ids-file): the prompts; sequence i of round r's timed run takes
  // prompt (r * batch + i) mod size, of its warm-up run w prompt ((r + w + 1) * batch + i) mod
  // size; prompt_len is then unused.
  std::vector<std::vector<int32_t>> prompts;
};

// Prints one row per (round, batch): prefill time, mean decode tokens/s and the median, p90
// and p99 of the decode steps (table, or JSON with every step's time). With speculative
// decoding (opt.speculative) a step emits up to draft_tokens + 1 tokens per sequence: decode
// tokens/s counts the tokens, and the rows carry the drafts proposed and accepted. Fails the
// command on an engine error.
void run_bench_e2e(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights, const E2eSpec& spec);

}  // namespace afd::cli
