// Batched generation loop over an Engine: prefill every prompt in one forward pass, then
// decode all live sequences one token per step until max_new_tokens or EOS — or, with a
// drafter, one verification item per sequence and step (runtime/speculative.h) that emits
// between 1 and draft_tokens + 1 tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace afd {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplingParams sampling;     // each prompt i gets seed sampling.seed + i
  bool stop_at_eos = true;
  bool keep_logits = false;    // record one logits row per prompt position and generated step
  // Speculative decoding: drafts proposed by `drafter` (not owned; null: none), at most
  // draft_tokens per sequence and step.
  Drafter* drafter = nullptr;
  int64_t draft_tokens = 0;
  // Drafts only in steps with at most this many sequences (0: always; SpeculativeOptions::kMaxBatchAuto:
  // as a SpeculationGovernor measures).
  int64_t draft_max_batch = 0;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> tokens;  // generated ids per prompt
  // When keep_logits: per prompt, rows [prompt_len + generated - 1, vocab]: every prompt
  // position, then the row after each generated token except the last (the rows that chose
  // tokens 2..; with speculation, the verification rows that chose them). Flattened.
  std::vector<std::vector<float>> logits;
  int64_t decode_steps = 0;
  double prefill_s = 0, decode_s = 0;
  std::vector<double> decode_step_s;  // [decode_steps]: wall time of each decode step (forward + sampling)
  SpeculativeStats speculative;       // with a drafter
};

Result<GenerateResult> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                const GenerateOptions& opt);

}  // namespace afd
