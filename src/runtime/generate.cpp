#include "runtime/generate.h"

#include <algorithm>

#include "core/timer.h"

namespace afd {

namespace {
struct Live {
  int64_t seq = -1;
  bool done = false;
};
}  // namespace

Result<GenerateResult> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                const GenerateOptions& opt) {
  if (opt.max_new_tokens <= 0) return invalid_argument("max new tokens must be positive");
  AFD_RETURN_IF_ERROR(opt.sampling.validate());
  const ModelConfig& c = engine.config();
  const int64_t V = c.vocab_size, n = static_cast<int64_t>(prompts.size());
  GenerateResult res;
  res.tokens.resize(n);
  res.logits.resize(n);

  // As vLLM does: refuse up front when a prompt plus its new tokens cannot fit the context.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t need = static_cast<int64_t>(prompts[i].size()) + opt.max_new_tokens - 1;
    if (c.max_position_embeddings > 0 && need > c.max_position_embeddings)
      return out_of_range("prompt " + std::to_string(i) + ": " + std::to_string(prompts[i].size()) +
                          " prompt tokens + " + std::to_string(opt.max_new_tokens) +
                          " new tokens exceed the model's max_position_embeddings (" +
                          std::to_string(c.max_position_embeddings) + ")");
  }

  std::vector<Live> live(static_cast<size_t>(n));
  std::vector<Sampler> samplers;
  auto release_all = [&] {
    for (auto& l : live) if (l.seq >= 0) engine.release_sequence(l.seq);
  };
  for (int64_t i = 0; i < n; ++i) {
    if (prompts[i].empty()) { release_all(); return invalid_argument("prompt " + std::to_string(i) + " is empty"); }
    auto id = engine.create_sequence();
    if (!id.ok()) { release_all(); return id.status(); }
    live[i].seq = *id;
    SamplingParams sp = opt.sampling;
    sp.seed = opt.sampling.seed + static_cast<uint64_t>(i);
    samplers.emplace_back(sp);
  }

  auto is_eos = [&](int32_t t) {
    return std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), t) != c.eos_token_ids.end();
  };

  // Prefill.
  std::vector<BatchItem> items;
  for (int64_t i = 0; i < n; ++i) items.push_back(BatchItem{live[i].seq, prompts[i], opt.keep_logits});
  std::vector<float> logits;
  int64_t t0 = now_ns();
  Status s = engine.forward(items, &logits);
  if (!s.is_ok()) { release_all(); return s; }
  res.prefill_s = (now_ns() - t0) * 1e-9;

  std::vector<int32_t> last(static_cast<size_t>(n));
  int64_t row = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t rows = opt.keep_logits ? static_cast<int64_t>(prompts[i].size()) : 1;
    if (opt.keep_logits) res.logits[i].assign(logits.begin() + row * V, logits.begin() + (row + rows) * V);
    row += rows;
    const float* lrow = &logits[(row - 1) * V];
    last[i] = samplers[i].sample(lrow, V).token;
    res.tokens[i].push_back(last[i]);
    if ((opt.stop_at_eos && is_eos(last[i])) || opt.max_new_tokens == 1) live[i].done = true;
  }

  // Decode.
  t0 = now_ns();
  for (;;) {
    items.clear();
    std::vector<int64_t> who;
    for (int64_t i = 0; i < n; ++i) {
      if (live[i].done) continue;
      items.push_back(BatchItem{live[i].seq, std::span<const int32_t>(&last[i], 1), false});
      who.push_back(i);
    }
    if (items.empty()) break;
    const int64_t step_t0 = now_ns();
    s = engine.forward(items, &logits);
    if (!s.is_ok()) { release_all(); return s; }
    ++res.decode_steps;
    for (size_t k = 0; k < who.size(); ++k) {
      const int64_t i = who[k];
      const float* lrow = &logits[k * V];
      if (opt.keep_logits) res.logits[i].insert(res.logits[i].end(), lrow, lrow + V);
      last[i] = samplers[i].sample(lrow, V).token;
      res.tokens[i].push_back(last[i]);
      if ((opt.stop_at_eos && is_eos(last[i])) ||
          static_cast<int64_t>(res.tokens[i].size()) >= opt.max_new_tokens)
        live[i].done = true;
    }
    res.decode_step_s.push_back((now_ns() - step_t0) * 1e-9);
  }
  res.decode_s = (now_ns() - t0) * 1e-9;
  release_all();
  return res;
}

}  // namespace afd
