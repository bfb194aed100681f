#include "serve/scheduling/scheduler.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/log.h"
#include "core/timer.h"
#include "runtime/engine_options.h"

namespace afd::serve {

SeqRequest::SeqRequest(const GenerationRequest& g, const Tokenizer* tok, std::vector<int32_t> eos, double arrival_s)
    : tokens(g.prompt),
      n_prompt(static_cast<int64_t>(g.prompt.size())),
      logprobs(g.logprobs),
      sampler(g.sampling),
      output(tok, std::move(eos), g.stop, g.max_tokens, g.ignore_eos),
      t_arrival(arrival_s) {
  if (g.format.grammar) grammar.emplace(g.format.grammar);
}

Scheduler::Scheduler(Engine* engine, SchedulerOptions opt, WorkerStats* stats, Metrics* metrics, Drafter* drafter)
    : engine_(engine),
      opt_(opt),
      stats_(stats),
      metrics_(metrics),
      drafter_(opt.draft_tokens > 0 ? drafter : nullptr),
      vocab_(engine->config().vocab_size) {}

Scheduler::~Scheduler() { stop(); }

Status Scheduler::submit(std::shared_ptr<SeqRequest> r) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return unavailable("the server is shutting down");
    if (static_cast<int64_t>(waiting_.size()) >= opt_.max_queue)
      return resource_exhausted("the request queue is full (" + std::to_string(opt_.max_queue) + " waiting)");
    if (stats_) {
      stats_->queue_depth.fetch_add(1);
      stats_->token_load.fetch_add(static_cast<int64_t>(r->tokens.size()));
    }
    if (metrics_ && r->grammar) metrics_->structured.requests.fetch_add(1);
    waiting_.push_back(std::move(r));
    idle_ = false;
  }
  cv_.notify_one();
  return Status();
}

bool Scheduler::wait_for_engine(double t_fail, int attempt) {
  const double deadline = t_fail + opt_.step_retry_s;
  // Back off between attempts (50 ms, doubling to 1 s), so a failure that health() does not
  // reflect is not retried in a tight loop.
  auto pause = std::chrono::milliseconds(std::min(1000, 50 << std::min(attempt, 5)));
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      if (cv_.wait_for(l, pause, [&] { return stop_; })) return false;
    }
    if (now_s() >= deadline) return false;
    if (engine_->health().is_ok()) return true;
    pause = std::chrono::milliseconds(50);
  }
}

bool Scheduler::idle() const {
  std::lock_guard<std::mutex> l(mu_);
  return idle_;
}

int64_t Scheduler::n_waiting() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int64_t>(waiting_.size());
}

void Scheduler::release(SeqRequest* r) {
  if (r->seq_id < 0) return;
  engine_->release_sequence(r->seq_id);
  if (drafter_) drafter_->release_sequence(r->seq_id);
  r->seq_id = -1;
}

void Scheduler::finish(SeqRequest* r, FinishReason why, Status err) {
  release(r);
  StreamEvent e;
  e.finish = why;
  e.error = std::move(err);
  e.prompt_tokens = r->n_prompt;
  e.completion_tokens = r->output.n_generated();
  r->channel->push(std::move(e));
}

void Scheduler::drop_cancelled() {
  for (auto& r : running_) {
    if (r->channel->cancelled() && r->seq_id >= 0) {
      release(r.get());
      if (metrics_) metrics_->requests_cancelled.fetch_add(1);
    }
  }
  std::erase_if(running_, [](const auto& r) { return r->seq_id < 0; });
  std::lock_guard<std::mutex> l(mu_);
  std::erase_if(waiting_, [&](const auto& r) {
    if (!r->channel->cancelled()) return false;
    if (metrics_) metrics_->requests_cancelled.fetch_add(1);
    return true;
  });
}

int Scheduler::admit() {
  KvUsage u = engine_->kv_usage();
  int64_t free_blocks = u.blocks_total - u.blocks_used;
  // Blocks the running sequences need for their next step, in all and per KV pool (a sequence
  // grows only in its own pool, Engine::kv_pool); the admitted ones are added to their pool's.
  std::map<int, int64_t> pool_claimed;
  for (auto& r : running_) {
    const int64_t len = engine_->sequence_length(r->seq_id);
    const int64_t grow =
        std::max<int64_t>(0, engine_->kv_blocks_needed(r->seq_id, static_cast<int64_t>(r->tokens.size()) + 1 - len));
    free_blocks -= grow;
    pool_claimed[engine_->kv_pool(r->seq_id)] += grow;
  }
  int admitted = 0;
  for (;;) {
    std::shared_ptr<SeqRequest> r;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (waiting_.empty() || static_cast<int64_t>(running_.size()) >= opt_.max_running) break;
      r = waiting_.front();
    }
    const int64_t need = engine_->kv_blocks_needed(Engine::kNewSequence, static_cast<int64_t>(r->tokens.size()) + 1);
    if (u.blocks_total > 0 && need > u.blocks_total) {
      {
        std::lock_guard<std::mutex> l(mu_);
        waiting_.pop_front();
      }
      finish(r.get(), FinishReason::error,
             resource_exhausted("the request needs " + std::to_string(need) + " KV blocks; the cache has " +
                                std::to_string(u.blocks_total)));
      continue;
    }
    // Head of line waits for blocks to free up (engines reporting no block pool: can_append decides).
    if (u.blocks_total > 0 && need > free_blocks) break;
    auto seq = engine_->create_sequence();
    if (!seq.ok()) break;  // no free sequence slot
    r->seq_id = *seq;
    // Prefix caching: KV of the longest cached whole-block prefix of prompt (+ tokens
    // generated before a preemption) is mapped in; the engine leaves at least one token to
    // compute, so the next forward still yields the logits to sample from.
    const int64_t n_tok = static_cast<int64_t>(r->tokens.size());
    // A drafter that reads hidden states (MTP) must see every position computed: no reuse.
    const bool may_reuse = !(drafter_ && drafter_->needs_hidden());
    const int64_t hit = may_reuse ? engine_->reuse_prefix(r->seq_id, r->tokens) : 0;
    r->n_computed = hit > 0 && hit < n_tok ? hit : 0;
    if (hit != r->n_computed) {
      // An engine broke the contract (hit >= the whole context): start over without it.
      spdlog::error("engine reused {} of {} tokens; recomputing the sequence", hit, n_tok);
      engine_->release_sequence(r->seq_id);
      auto again = engine_->create_sequence();
      if (!again.ok()) {
        r->seq_id = -1;
        break;
      }
      r->seq_id = *again;
    }
    // The pool it was placed in (after reuse_prefix, which may move it to the engine holding
    // its prefix) must hold its context too; else it waits, as for the sum of the pools above.
    {
      const int pool = engine_->kv_pool(r->seq_id);
      const KvUsage pu = engine_->kv_pool_usage(pool);
      const int64_t grow = std::max<int64_t>(
          0, engine_->kv_blocks_needed(r->seq_id, n_tok + 1 - std::max<int64_t>(0, engine_->sequence_length(r->seq_id))));
      if (pu.blocks_total > 0 && pool_claimed[pool] + grow > pu.blocks_total - pu.blocks_used) {
        engine_->release_sequence(r->seq_id);
        r->seq_id = -1;
        r->n_computed = 0;
        break;
      }
      pool_claimed[pool] += grow;
    }
    if (drafter_) {
      if (Status ds = drafter_->add_sequence(r->seq_id); !ds.is_ok()) {
        spdlog::warn("drafter: {}; the sequence waits", ds.to_string());
        engine_->release_sequence(r->seq_id);
        r->seq_id = -1;
        break;
      }
    }
    if (metrics_) {
      metrics_->prefix_cache_queries.fetch_add(n_tok);
      metrics_->prefix_cache_hits.fetch_add(r->n_computed);
    }
    free_blocks -= need;
    {
      std::lock_guard<std::mutex> l(mu_);
      waiting_.pop_front();
    }
    running_.push_back(std::move(r));
    ++admitted;
  }
  return admitted;
}

bool Scheduler::preempt_one(const SeqRequest* keep) {
  const int pool = engine_->kv_pool(keep->seq_id);
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    SeqRequest* v = it->get();
    if (v == keep || v->seq_id < 0 || engine_->kv_pool(v->seq_id) != pool) continue;
    release(v);
    v->n_computed = 0;  // recompute prompt + generated tokens when readmitted
    std::shared_ptr<SeqRequest> sp = *it;
    running_.erase(std::next(it).base());
    {
      std::lock_guard<std::mutex> l(mu_);
      waiting_.push_front(std::move(sp));
    }
    if (stats_) stats_->preemptions.fetch_add(1);
    return true;
  }
  return false;
}

std::vector<BatchItem> Scheduler::form_batch(std::vector<SeqRequest*>* order) {
  std::vector<BatchItem> items;
  order->clear();
  propose_drafts();
  const bool all_rows = drafter_ && drafter_->needs_hidden();
  int64_t budget = opt_.max_batch_tokens;
  // KV blocks the items so far take (per item; an item whose sequence was preempted since
  // takes none): Engine::can_append checks one sequence against the free blocks, and the
  // batch as a whole must fit too, or the forward pass fails for every sequence in it.
  // Counted per KV pool (Engine::kv_pool): a sequence's blocks come from its pool only.
  std::vector<int64_t> item_blocks;
  std::vector<int> item_pool;
  auto extra_blocks = [&](const SeqRequest* r, int64_t n) {
    return std::max<int64_t>(0, engine_->kv_blocks_needed(r->seq_id, n));
  };
  auto fits = [&](const SeqRequest* r, int64_t n) {
    if (!engine_->can_append(r->seq_id, n)) return false;
    const int pool = engine_->kv_pool(r->seq_id);
    const KvUsage u = engine_->kv_pool_usage(pool);
    if (u.blocks_total <= 0) return true;  // no block pool reported: can_append decides
    int64_t claimed = 0;
    for (size_t k = 0; k < items.size(); ++k)
      if ((*order)[k]->seq_id == items[k].seq_id && item_pool[k] == pool) claimed += item_blocks[k];
    return claimed + extra_blocks(r, n) <= u.blocks_total - u.blocks_used;
  };
  // Pass 0: sequences in decode (one token); pass 1: prefill chunks with what budget is left.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      SeqRequest* r = running_[i].get();
      if (r->seq_id < 0) continue;
      int64_t remaining = static_cast<int64_t>(r->tokens.size()) - r->n_computed;
      bool decode = remaining == 1 && r->n_computed > 0;
      if ((pass == 0) != decode || remaining <= 0) continue;
      int64_t n_new = std::min(remaining, budget);
      if (r->n_computed < r->replay_end)
        n_new = std::min(n_new, r->n_computed < r->n_prompt ? r->n_prompt - r->n_computed : int64_t{1});
      // Drafts ride along when the budget and the KV cache have room for them.
      if (decode && r->n_draft > 0 && (1 + r->n_draft > budget || !fits(r, 1 + r->n_draft))) r->n_draft = 0;
      while (!fits(r, n_new)) {
        if (!preempt_one(r)) break;
      }
      if (!fits(r, n_new)) {
        // Alone and still no room: the KV cache cannot hold this sequence.
        finish(r, FinishReason::error, resource_exhausted("KV cache exhausted: the sequence no longer fits"));
        continue;
      }
      BatchItem it;
      it.seq_id = r->seq_id;
      if (decode && r->n_draft > 0) {
        it.tokens = std::span<const int32_t>(r->step_tokens.data(), static_cast<size_t>(1 + r->n_draft));
        it.n_draft = r->n_draft;
        n_new = 1 + r->n_draft;
      } else {
        it.tokens = std::span<const int32_t>(r->tokens.data() + r->n_computed, static_cast<size_t>(n_new));
      }
      it.all_logits = it.n_draft > 0 || all_rows;
      item_blocks.push_back(extra_blocks(r, n_new));
      item_pool.push_back(engine_->kv_pool(r->seq_id));
      items.push_back(it);
      order->push_back(r);
      budget -= n_new;
    }
  }
  // preempt_one may have released sequences that already had items: drop those items.
  std::vector<BatchItem> kept;
  std::vector<SeqRequest*> kept_order;
  for (size_t i = 0; i < items.size(); ++i)
    if ((*order)[i]->seq_id == items[i].seq_id && items[i].seq_id >= 0) {
      kept.push_back(items[i]);
      kept_order.push_back((*order)[i]);
    }
  *order = std::move(kept_order);
  remove_finished();
  return kept;
}

void Scheduler::remove_finished() {
  std::erase_if(running_, [](const auto& r) { return r->seq_id < 0; });
}

void Scheduler::propose_drafts() {
  step_decoding_ = 0;
  step_drafts_ = false;
  if (!drafter_) return;
  std::vector<Drafter::Query> queries;
  std::vector<SeqRequest*> who;
  int64_t n_decoding = 0;
  for (auto& rp : running_) {
    SeqRequest* r = rp.get();
    r->n_draft = 0;
    if (r->seq_id < 0 || r->n_computed == 0) continue;
    if (static_cast<int64_t>(r->tokens.size()) - r->n_computed != 1) continue;  // not decoding
    ++n_decoding;
    if (r->n_computed < r->replay_end) continue;
    const int64_t max_drafts = std::min(opt_.draft_tokens, r->output.tokens_left() - 1);
    if (max_drafts <= 0) continue;
    queries.push_back(Drafter::Query{r->seq_id, r->tokens, max_drafts});
    who.push_back(r);
  }
  step_decoding_ = n_decoding;
  if (queries.empty()) return;
  if (opt_.draft_max_batch == SpeculativeOptions::kMaxBatchAuto) {
    if (!governor_.use_drafts(n_decoding)) return;
  } else if (opt_.draft_max_batch > 0 && n_decoding > opt_.draft_max_batch) {
    return;
  }
  std::vector<std::vector<int32_t>> drafts;
  if (Status s = drafter_->propose(queries, &drafts); !s.is_ok()) {
    // Drafts only save time: the step runs without them.
    spdlog::warn("drafter: {}; this step decodes without drafts", s.to_string());
    return;
  }
  for (size_t i = 0; i < who.size(); ++i) {
    SeqRequest* r = who[i];
    if (r->grammar) {
      GrammarMatcher m = *r->grammar;
      size_t n = 0;
      while (n < drafts[i].size() && !m.is_finished() && m.accept_token(drafts[i][n])) ++n;
      drafts[i].resize(n);
    }
    r->step_tokens.assign(1, r->tokens.back());
    r->step_tokens.insert(r->step_tokens.end(), drafts[i].begin(), drafts[i].end());
    r->n_draft = static_cast<int64_t>(drafts[i].size());
  }
  step_drafts_ = true;
}

bool Scheduler::fill_masks(SeqRequest* r, const BatchItem& it) {
  const int64_t words = r->grammar->mask_words();
  const int64_t n = it.n_draft + 1;
  r->masks.assign(static_cast<size_t>(n * words), 0);
  if (it.n_draft == 0) {
    r->grammar->fill_next_token_mask(r->masks.data());
  } else {
    // propose_drafts kept only drafts the grammar takes, so each position's mask is the
    // grammar's after the drafts before it (a row after a draft it would refuse stays empty:
    // verification stops at that draft, whose own mask does not allow it).
    GrammarMatcher m = *r->grammar;
    for (int64_t j = 0; j < n; ++j) {
      m.fill_next_token_mask(r->masks.data() + j * words);
      if (j < it.n_draft && !m.accept_token(it.tokens[1 + j])) break;
    }
  }
  for (int64_t w = 0; w < words; ++w)
    if (r->masks[w]) return true;
  return false;
}

void Scheduler::process_logits(const std::vector<SeqRequest*>& order, const std::vector<BatchItem>& items,
                               const std::vector<float>& logits, const std::vector<float>& hidden) {
  const double now = now_s();
  const int64_t H = engine_->config().hidden_size;
  const bool observe = drafter_ && drafter_->needs_hidden() && !hidden.empty();
  int64_t row = 0;  // first logits row of item i
  for (size_t i = 0; i < order.size(); ++i) {
    SeqRequest* r = order[i];
    const BatchItem& it = items[i];
    const int64_t n_rows = it.all_logits ? static_cast<int64_t>(it.tokens.size()) : 1;
    const int64_t row0 = row;
    row += n_rows;
    const int64_t pos0 = r->n_computed;  // position of the item's first token
    const int64_t n_final = static_cast<int64_t>(it.tokens.size()) - it.n_draft;
    r->n_computed += n_final;
    auto observe_rows = [&](int64_t n) {  // positions [pos0, pos0 + n) are final, tokens known
      if (!observe || n <= 0 || r->seq_id < 0) return;
      Status s = drafter_->observe(r->seq_id, pos0, std::span<const float>(&hidden[row0 * H], static_cast<size_t>(n * H)),
                                   std::span<const int32_t>(r->tokens.data() + pos0 + 1, static_cast<size_t>(n)));
      if (!s.is_ok()) spdlog::warn("drafter: {}", s.to_string());
    };
    if (r->n_computed < static_cast<int64_t>(r->tokens.size())) {  // prefill chunk, more to come
      observe_rows(n_rows);
      continue;
    }
    const float* rows = logits.data() + (row0 + n_rows - 1 - it.n_draft) * vocab_;
    std::vector<const uint64_t*> masks;
    bool complete = false;  // the grammar allows nothing more: the answer ends without a token
    if (r->grammar) {
      if (r->grammar->mask_words() != (vocab_ + 63) / 64) {
        finish(r, FinishReason::error, internal_error("the grammar's vocabulary differs from the model's"));
        continue;
      }
      const auto t_mask = std::chrono::steady_clock::now();
      complete = !fill_masks(r, it);
      if (metrics_) {
        metrics_->structured.masks.fetch_add(it.n_draft + 1);
        metrics_->structured.mask_ns.fetch_add(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t_mask).count());
      }
      for (int64_t j = 0; j <= it.n_draft; ++j) masks.push_back(r->masks.data() + j * r->grammar->mask_words());
    }
    std::vector<SampledToken> emitted;
    if (complete) {
      // Nothing sampled; the engine sequence (drafts included) is released below.
    } else if (it.n_draft > 0) {
      emitted = verify_drafts(r->sampler, rows, vocab_, it.tokens.subspan(1), masks);
      const int64_t accepted = static_cast<int64_t>(emitted.size()) - 1;
      if (Status st = engine_->settle_drafts(r->seq_id, accepted); !st.is_ok()) {
        finish(r, FinishReason::error, st);
        continue;
      }
      r->n_computed += accepted;
      if (metrics_) metrics_->speculative.record(it.n_draft, accepted);
    } else {
      emitted.push_back(r->sampler.sample(rows, vocab_, masks.empty() ? nullptr : masks[0]));
    }
    StreamEvent e;
    FinishReason fin = FinishReason::none;
    if (complete) {
      e.text = r->output.complete().text;
      fin = FinishReason::stop;
    }
    int64_t pushed = 0;
    bool grammar_failed = false;
    for (SampledToken& s : emitted) {
      r->tokens.push_back(s.token);
      OutputProcessor::Step st = r->output.push(s.token);
      ++pushed;
      e.text += st.text;
      TokenInfo ti;
      ti.token = s.token;
      ti.logprob = s.logprob;
      ti.top = std::move(s.top_logprobs);
      e.tokens.push_back(std::move(ti));
      if (st.finish != FinishReason::none) {
        fin = st.finish;
        break;
      }
      if (r->grammar) {
        // The sampler kept to the mask, so the grammar takes the token (a matcher that could
        // not — its stack bound reached — fails the request, never the server); an end token
        // ends the answer also under ignore_eos (nothing may follow it).
        if (!r->grammar->accept_token(s.token)) {
          grammar_failed = true;
          break;
        }
        if (r->grammar->is_finished()) {
          e.text += r->output.complete().text;
          fin = FinishReason::stop;
          break;
        }
      }
    }
    step_emitted_ += pushed;
    e.rng_draws = r->sampler.draws();
    if (grammar_failed) {
      r->channel->push(std::move(e));
      finish(r, FinishReason::error,
             internal_error("the output format's grammar matcher passed its stack bound (an extremely ambiguous grammar)"));
      continue;
    }
    if (pushed > 0 && r->output.n_generated() == pushed) {
      r->t_first = now;
      if (metrics_) metrics_->ttft.observe(now - r->t_arrival);
    }
    r->t_last = now;
    if (metrics_) metrics_->generation_tokens.fetch_add(pushed);
    if (fin != FinishReason::none) {
      e.finish = fin;
      e.prompt_tokens = r->n_prompt;
      e.completion_tokens = r->output.n_generated();
      release(r);
      if (metrics_) {
        int64_t n = r->output.n_generated();
        if (n > 1) metrics_->tpot.observe((r->t_last - r->t_first) / static_cast<double>(n - 1));
        metrics_->e2e.observe(now - r->t_arrival);
      }
    } else {
      // The rows of every position now final: the item's tokens before its drafts, and the accepted drafts.
      observe_rows(n_final + static_cast<int64_t>(emitted.size()) - 1);
    }
    r->channel->push(std::move(e));
  }
  remove_finished();
}

void Scheduler::publish_stats() {
  if (!stats_) return;
  int64_t load = 0;
  for (auto& r : running_) load += static_cast<int64_t>(r->tokens.size());
  int64_t n_wait;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& r : waiting_) load += static_cast<int64_t>(r->tokens.size());
    n_wait = static_cast<int64_t>(waiting_.size());
  }
  stats_->queue_depth.store(n_wait);
  stats_->running.store(static_cast<int64_t>(running_.size()));
  stats_->token_load.store(load);
  KvUsage u = engine_->kv_usage();
  stats_->kv_blocks_used.store(u.blocks_used);
  stats_->kv_blocks_total.store(u.blocks_total);
}

void Scheduler::publish_governor() {
  stats_->spec_auto.store(true);
  for (int b = 0; b < WorkerStats::kSpecBuckets && b < SpeculationGovernor::kBuckets; ++b) {
    stats_->spec_side[b].store(governor_.preferred(b));
    stats_->spec_rate_on[b].store(governor_.rate(b, true));
    stats_->spec_rate_off[b].store(governor_.rate(b, false));
  }
}

Result<int> Scheduler::step() {
  drop_cancelled();
  int admitted = admit();
  if (metrics_ && admitted > 0) {
    for (size_t i = running_.size() - admitted; i < running_.size(); ++i)
      if (running_[i]->output.n_generated() == 0) metrics_->prompt_tokens.fetch_add(running_[i]->n_prompt);
  }
  std::vector<SeqRequest*> order;
  const double step_t0 = now_s();
  std::vector<BatchItem> items = form_batch(&order);
  if (items.empty()) {
    publish_stats();
    return 0;
  }
  std::vector<float> logits, hidden;
  const bool with_hidden = drafter_ && drafter_->needs_hidden();
  auto run = [&] { return with_hidden ? engine_->forward_with_hidden(items, &logits, &hidden) : engine_->forward(items, &logits); };
  double t0 = now_s();
  Status st = run();
  // A lost or stalled AFD peer: the sequences are unchanged, so the same batch can run again
  // once the engine is healthy (the peer reconnected or answers), within the retry budget.
  const double t_fail = now_s();
  for (int attempt = 0; !st.is_ok() && (st.code() == StatusCode::unavailable || st.code() == StatusCode::timeout) &&
                        opt_.step_retry_s > 0;
       ++attempt) {
    spdlog::warn("engine forward failed for a batch of {} sequences: {}; holding them for up to {} s", items.size(),
                 st.to_string(), opt_.step_retry_s);
    if (!wait_for_engine(t_fail, attempt)) break;
    if (stats_) stats_->step_retries.fetch_add(1);
    spdlog::info("retrying the forward pass of {} sequences after {:.1f} s", items.size(), now_s() - t_fail);
    logits.clear();
    t0 = now_s();
    st = run();
  }
  double dt = now_s() - t0;
  if (stats_) {
    stats_->steps.fetch_add(1);
    std::lock_guard<std::mutex> l(stats_->mu);
    StageTimes s = engine_->last_stage_times();
    stats_->stage_sum.attention_s += s.attention_s;
    stats_->stage_sum.a2f_s += s.a2f_s;
    stats_->stage_sum.ffn_s += s.ffn_s;
    stats_->stage_sum.f2a_s += s.f2a_s;
    stats_->stage_sum.total_s += s.total_s > 0 ? s.total_s : dt;
    auto& layers = stats_->stage_sum.layers;
    if (layers.size() < s.layers.size()) layers.resize(s.layers.size());
    for (size_t l = 0; l < s.layers.size(); ++l) layers[l].add(s.layers[l]);
    stats_->busy_s += dt;
  }
  if (!st.is_ok()) {
    spdlog::error("engine forward failed for a batch of {} sequences: {}", items.size(), st.to_string());
    for (SeqRequest* r : order) finish(r, FinishReason::error, st);
    remove_finished();
    publish_stats();
    return st;
  }
  size_t rows = 0;
  for (const BatchItem& it : items) rows += it.all_logits ? it.tokens.size() : 1;
  if (logits.size() < rows * static_cast<size_t>(vocab_) ||
      (with_hidden && hidden.size() < rows * static_cast<size_t>(engine_->config().hidden_size))) {
    Status bad = internal_error("engine returned " + std::to_string(logits.size()) + " logits for " +
                                std::to_string(items.size()) + " items (" + std::to_string(rows) + " rows)");
    for (SeqRequest* r : order) finish(r, FinishReason::error, bad);
    remove_finished();
    publish_stats();
    return bad;
  }
  // Prefill = every item that is not a single decode token (prompt chunks, and the recompute
  // of a re-admitted sequence); prefix-cache hits are never forwarded.
  int64_t prefill = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const SeqRequest* r = order[i];
    const bool decode = items[i].tokens.size() == 1 + static_cast<size_t>(items[i].n_draft) && r->n_computed > 0 &&
                        r->n_computed + 1 == static_cast<int64_t>(r->tokens.size());
    if (!decode) prefill += static_cast<int64_t>(items[i].tokens.size());
  }
  if (metrics_) metrics_->prefill_tokens.fetch_add(prefill);
  step_emitted_ = 0;
  process_logits(order, items, logits, hidden);
  if (opt_.draft_max_batch == SpeculativeOptions::kMaxBatchAuto && drafter_ && prefill == 0 && step_decoding_ > 0)
  {
    governor_.record(step_decoding_, step_drafts_, now_s() - step_t0, step_emitted_);
    if (stats_) publish_governor();
  }
  publish_stats();
  return static_cast<int>(items.size());
}

void Scheduler::start() {
  thread_ = std::thread([this] {
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        if (stop_) break;
        if (running_.empty() && waiting_.empty()) {
          idle_ = true;  // running_ is this thread's; waiting_ is read under mu_: consistent
          double t0 = now_s();
          cv_.wait(l, [&] { return stop_ || !waiting_.empty(); });
          if (stats_) {
            std::lock_guard<std::mutex> sl(stats_->mu);
            stats_->idle_s += now_s() - t0;
          }
          if (stop_) break;
        }
      }
      Result<int> n = step();
      if (n.ok() && *n == 0) {
        // Nothing runnable (e.g. waiting for KV blocks with nothing running): back off briefly.
        double t0 = now_s();
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait_for(l, std::chrono::milliseconds(2), [&] { return stop_; });
        if (stats_) {
          std::lock_guard<std::mutex> sl(stats_->mu);
          stats_->idle_s += now_s() - t0;
        }
      }
    }
    for (auto& r : running_) finish(r.get(), FinishReason::cancelled, unavailable("server shutting down"));
    running_.clear();
    std::lock_guard<std::mutex> l(mu_);
    for (auto& r : waiting_) finish(r.get(), FinishReason::cancelled, unavailable("server shutting down"));
    waiting_.clear();
  });
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace afd::serve
