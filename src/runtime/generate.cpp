#include "runtime/generate.h"

#include <algorithm>

#include "core/timer.h"
#include "runtime/engine_options.h"
#include "runtime/speculation_governor.h"

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

  Drafter* const drafter = opt.draft_tokens > 0 ? opt.drafter : nullptr;
  const bool with_hidden = drafter && drafter->needs_hidden();
  auto release_everything = [&] {
    if (drafter)
      for (auto& l : live) drafter->release_sequence(l.seq);  // keys never added are ignored
    release_all();
  };
  for (int64_t i = 0; drafter && i < n; ++i) {
    if (Status ds = drafter->add_sequence(live[i].seq); !ds.is_ok()) {
      release_everything();
      return ds;
    }
  }

  // Prefill (every position's row when the logits are kept or the drafter reads hidden states).
  std::vector<BatchItem> items;
  const bool all_rows = opt.keep_logits || with_hidden;
  for (int64_t i = 0; i < n; ++i) items.push_back(BatchItem{live[i].seq, prompts[i], all_rows});
  std::vector<float> logits, hidden;
  int64_t t0 = now_ns();
  Status s = with_hidden ? engine.forward_with_hidden(items, &logits, &hidden) : engine.forward(items, &logits);
  if (!s.is_ok()) { release_everything(); return s; }
  res.prefill_s = (now_ns() - t0) * 1e-9;

  const int64_t H = c.hidden_size;
  std::vector<int32_t> last(static_cast<size_t>(n));
  // Per prompt: the prompt and every generated token (the drafter's context).
  std::vector<std::vector<int32_t>> ctx(prompts.begin(), prompts.end());
  int64_t row = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t rows = all_rows ? static_cast<int64_t>(prompts[i].size()) : 1;
    if (opt.keep_logits) res.logits[i].assign(logits.begin() + row * V, logits.begin() + (row + rows) * V);
    const float* lrow = &logits[(row + rows - 1) * V];
    last[i] = samplers[i].sample(lrow, V).token;
    res.tokens[i].push_back(last[i]);
    ctx[i].push_back(last[i]);
    if ((opt.stop_at_eos && is_eos(last[i])) || opt.max_new_tokens == 1) live[i].done = true;
    if (with_hidden && !live[i].done) {
      s = drafter->observe(live[i].seq, 0, std::span<const float>(&hidden[row * H], static_cast<size_t>(rows * H)),
                           std::span<const int32_t>(ctx[i].data() + 1, static_cast<size_t>(rows)));
      if (!s.is_ok()) { release_everything(); return s; }
    }
    row += rows;
  }

  // Decode: per live sequence one item [last token, drafts...].
  t0 = now_ns();
  const bool governed = opt.draft_max_batch == SpeculativeOptions::kMaxBatchAuto;
  SpeculationGovernor governor;
  std::vector<Drafter::Query> queries;
  std::vector<std::vector<int32_t>> drafts, step_tokens(static_cast<size_t>(n));
  for (;;) {
    items.clear();
    queries.clear();
    std::vector<int64_t> who;
    for (int64_t i = 0; i < n; ++i) {
      if (live[i].done) continue;
      who.push_back(i);
      const int64_t left = opt.max_new_tokens - static_cast<int64_t>(res.tokens[i].size());
      queries.push_back(Drafter::Query{live[i].seq, ctx[i], std::min(opt.draft_tokens, left - 1)});
    }
    if (who.empty()) break;
    const int64_t step_t0 = now_ns();
    drafts.assign(who.size(), {});
    const int64_t n_live = static_cast<int64_t>(who.size());
    const bool draft_now = drafter && (governed ? governor.use_drafts(n_live)
                                                : opt.draft_max_batch <= 0 || n_live <= opt.draft_max_batch);
    int64_t step_emitted = 0;
    if (draft_now) {
      s = drafter->propose(queries, &drafts);
      if (!s.is_ok()) { release_everything(); return s; }
    }
    for (size_t k = 0; k < who.size(); ++k) {
      const int64_t i = who[k];
      std::vector<int32_t>& st = step_tokens[i];
      st.assign(1, last[i]);
      st.insert(st.end(), drafts[k].begin(), drafts[k].end());
      const int64_t d = static_cast<int64_t>(drafts[k].size());
      items.push_back(BatchItem{live[i].seq, st, d > 0, d});
    }
    s = with_hidden ? engine.forward_with_hidden(items, &logits, &hidden) : engine.forward(items, &logits);
    if (!s.is_ok()) { release_everything(); return s; }
    ++res.decode_steps;
    row = 0;
    for (size_t k = 0; k < who.size(); ++k) {
      const int64_t i = who[k];
      const int64_t d = items[k].n_draft;
      const int64_t pos = engine.sequence_length(live[i].seq) - 1 - d;  // position of last[i]
      const float* rows = &logits[row * V];
      std::vector<SampledToken> emitted;
      if (d > 0) {
        emitted = verify_drafts(samplers[i], rows, V, drafts[k]);
        const int64_t accepted = static_cast<int64_t>(emitted.size()) - 1;
        s = engine.settle_drafts(live[i].seq, accepted);
        if (!s.is_ok()) { release_everything(); return s; }
        res.speculative.record(d, accepted);
      } else {
        emitted.push_back(samplers[i].sample(rows, V));
      }
      int64_t used = 0;
      for (const SampledToken& t : emitted) {
        if (opt.keep_logits) res.logits[i].insert(res.logits[i].end(), rows + used * V, rows + (used + 1) * V);
        ++used;
        last[i] = t.token;
        res.tokens[i].push_back(t.token);
        ++step_emitted;
        ctx[i].push_back(t.token);
        if ((opt.stop_at_eos && is_eos(t.token)) ||
            static_cast<int64_t>(res.tokens[i].size()) >= opt.max_new_tokens) {
          live[i].done = true;
          break;
        }
      }
      if (with_hidden && !live[i].done) {
        s = drafter->observe(live[i].seq, pos, std::span<const float>(&hidden[row * H], static_cast<size_t>(used * H)),
                             std::span<const int32_t>(ctx[i].data() + ctx[i].size() - used, static_cast<size_t>(used)));
        if (!s.is_ok()) { release_everything(); return s; }
      }
      row += d > 0 ? d + 1 : 1;
    }
    res.decode_step_s.push_back((now_ns() - step_t0) * 1e-9);
    if (governed && drafter) governor.record(n_live, draft_now, res.decode_step_s.back(), step_emitted);
  }
  res.decode_s = (now_ns() - t0) * 1e-9;
  release_everything();
  return res;
}

}  // namespace afd
