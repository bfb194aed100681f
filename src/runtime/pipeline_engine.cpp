#include "runtime/pipeline_engine.h"

#include <algorithm>
#include <unordered_set>

#include "core/timer.h"
#include "model/attention_variant.h"
#include "model/weights.h"

namespace afd {

PipelineEngine::PipelineEngine(std::shared_ptr<const ModelWeights> w, std::unique_ptr<PagedKvCache> kv,
                               std::unique_ptr<FfnBackend> ffn, std::shared_ptr<ThreadPool> pool,
                               AttentionOptions attn_opt, int microbatches, int64_t max_seqs)
    : w_(std::move(w)),
      kv_(std::move(kv)),
      ffn_(std::move(ffn)),
      pool_(std::move(pool)),
      attn_(w_, kv_.get(), attn_opt, pool_.get()),
      microbatches_(std::clamp(microbatches, 1, 4)),
      max_seqs_(max_seqs),
      mb_storage_(static_cast<size_t>(microbatches_)) {}

Result<int64_t> PipelineEngine::create_sequence() {
  if (n_live_ >= max_seqs_)
    return resource_exhausted("engine: " + std::to_string(max_seqs_) + " sequences already live");
  const int64_t id = next_seq_++;
  AFD_RETURN_IF_ERROR(kv_->add_sequence(id));
  ++n_live_;
  return id;
}

void PipelineEngine::release_sequence(int64_t seq_id) {
  if (!kv_->has_sequence(seq_id)) return;
  kv_->remove_sequence(seq_id);
  drafts_.erase(seq_id);
  --n_live_;
}

Status PipelineEngine::settle_drafts(int64_t seq_id, int64_t n_accepted) {
  auto it = drafts_.find(seq_id);
  if (it == drafts_.end()) return invalid_argument("sequence " + std::to_string(seq_id) + " has no drafts to settle");
  const int64_t k = static_cast<int64_t>(it->second.size());
  if (n_accepted < 0 || n_accepted > k)
    return invalid_argument("sequence " + std::to_string(seq_id) + ": " + std::to_string(n_accepted) +
                            " drafts accepted of " + std::to_string(k));
  // The drafts were never committed, so truncate() stays above the committed tokens and
  // releases only blocks this sequence allocated itself.
  kv_->truncate(seq_id, kv_->length(seq_id) - (k - n_accepted));
  kv_->commit_tokens(seq_id, std::span<const int32_t>(it->second.data(), static_cast<size_t>(n_accepted)));
  drafts_.erase(it);
  return Status();
}

bool PipelineEngine::can_append(int64_t seq_id, int64_t n_tokens) const {
  const int64_t len = kv_->length(seq_id);
  if (len < 0 || n_tokens <= 0) return false;
  const int64_t max_pos = w_->config.max_position_embeddings;
  if (max_pos > 0 && len + n_tokens > max_pos) return false;
  return kv_->blocks_needed(seq_id, n_tokens) <= kv_->n_free_blocks();
}

int64_t PipelineEngine::kv_blocks_needed(int64_t seq_id, int64_t n_tokens) const {
  return seq_id == kNewSequence ? kv_->blocks_for_tokens(n_tokens) : kv_->blocks_needed(seq_id, n_tokens);
}

int64_t PipelineEngine::reuse_prefix(int64_t seq_id, std::span<const int32_t> prompt) {
  if (prompt.empty()) return 0;
  // At least one prompt token is computed: its logits start (or continue) generation.
  return kv_->reuse_prefix(seq_id, prompt, static_cast<int64_t>(prompt.size()) - 1);
}

int64_t PipelineEngine::cached_prefix(std::span<const int32_t> prompt) const {
  if (prompt.size() < 2) return 0;
  return kv_->match_prefix(prompt.first(prompt.size() - 1));
}

KvUsage PipelineEngine::kv_usage() const {
  return KvUsage{kv_->config().n_blocks, kv_->n_used_blocks(), kv_->config().block_size};
}

Status PipelineEngine::validate(std::span<const BatchItem> items) const {
  const ModelConfig& c = w_->config;
  std::unordered_set<int64_t> seen;
  int64_t blocks = 0;
  for (const BatchItem& it : items) {
    const int64_t len = kv_->length(it.seq_id);
    if (len < 0) return invalid_argument("unknown sequence " + std::to_string(it.seq_id));
    if (!seen.insert(it.seq_id).second)
      return invalid_argument("sequence " + std::to_string(it.seq_id) + " appears twice in one batch");
    if (it.tokens.empty()) return invalid_argument("sequence " + std::to_string(it.seq_id) + ": no tokens");
    if (it.n_draft < 0 || it.n_draft >= static_cast<int64_t>(it.tokens.size()))
      return invalid_argument("sequence " + std::to_string(it.seq_id) + ": " + std::to_string(it.n_draft) +
                              " drafts among " + std::to_string(it.tokens.size()) + " tokens");
    if (drafts_.count(it.seq_id))
      return invalid_argument("sequence " + std::to_string(it.seq_id) + " has drafts that were never settled");
    for (int32_t t : it.tokens) {
      if (t < 0 || t >= c.vocab_size)
        return out_of_range("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                            std::to_string(c.vocab_size) + ")");
    }
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    if (c.max_position_embeddings > 0 && len + n > c.max_position_embeddings)
      return out_of_range("context of " + std::to_string(len + n) + " tokens exceeds the model's " +
                          "max_position_embeddings (" + std::to_string(c.max_position_embeddings) + ")");
    blocks += kv_->blocks_needed(it.seq_id, n);
  }
  if (blocks > kv_->n_free_blocks())
    return resource_exhausted("kv cache: batch needs " + std::to_string(blocks) + " blocks, " +
                              std::to_string(kv_->n_free_blocks()) + " free");
  return Status();
}

namespace {
int64_t count_distinct_experts(const TokenBatch& b, const ModelConfig& c, int64_t layer, bool is_moe) {
  if (!is_moe) return 0;
  std::vector<uint8_t> seen(static_cast<size_t>(c.n_experts), 0);
  int64_t n = 0;
  for (int64_t t = 0; t < b.n * c.n_experts_per_tok; ++t) {
    if (!seen[b.topk_ids[t]]) { seen[b.topk_ids[t]] = 1; ++n; }
  }
  return n;
}
}  // namespace

Status PipelineEngine::fill_synthetic_context(int64_t seq_id, int64_t n_tokens) {
  const int64_t len = kv_->length(seq_id);
  if (len < 0) return invalid_argument("unknown sequence " + std::to_string(seq_id));
  AFD_RETURN_IF_ERROR(kv_->append(seq_id, n_tokens));
  // One token's K (and V) row as the cache lays it out (kv_layout; MLA: one latent row).
  const int64_t d = kv_->config().n_kv_heads * kv_->config().head_dim;
  std::vector<float> k(static_cast<size_t>(d)), v(static_cast<size_t>(d));
  for (int64_t p = len; p < len + n_tokens; ++p) {
    for (int64_t i = 0; i < d; ++i) {
      k[i] = 0.01f * static_cast<float>(((p * 131 + i * 31) % 197) - 98);
      v[i] = 0.01f * static_cast<float>(((p * 71 + i * 17) % 193) - 96);
    }
    for (int64_t l = 0; l < w_->config.n_layers; ++l) kv_->write(l, seq_id, p, k.data(), v.data());
  }
  return Status();
}

Status PipelineEngine::run_layers(std::vector<TokenBatch*>& mbs) {
  const int64_t n_layers = w_->config.n_layers;
  const int m = static_cast<int>(mbs.size());
  double attn_s = 0;
  times_.layers.assign(static_cast<size_t>(n_layers), LayerStageTimes{});
  for (TokenBatch* b : mbs) {
    const int64_t t0 = now_ns();
    attn_.embed(*b);
    attn_s += (now_ns() - t0) * 1e-9;
  }
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int mb = 0; mb < m; ++mb) {
      TokenBatch& b = *mbs[mb];
      if (l > 0) {
        const int64_t tw = now_ns();
        AFD_RETURN_IF_ERROR(ffn_->combine(l - 1, mb, b));
        if (trace_) trace_->span("wait FFN", trace_pid_, 1 + mb, tw, now_ns(), l - 1, mb, b.n);
        attn_.add_ffn(b);
      }
      const int64_t t0 = now_ns();
      attn_.forward(l, b);
      if (emulation_) emulation_->attention(b.n);
      const int64_t t1 = now_ns();
      attn_s += (t1 - t0) * 1e-9;
      times_.layers[static_cast<size_t>(l)].attention_s += (t1 - t0) * 1e-9;
      if (trace_) trace_->span("attention", trace_pid_, 1 + mb, t0, t1, l, mb, b.n);
      expert_reads_ += count_distinct_experts(b, w_->config, l, w_->layers[l].is_moe);
      const int64_t td = now_ns();
      AFD_RETURN_IF_ERROR(ffn_->dispatch(l, mb, b));
      if (trace_) trace_->span("dispatch", trace_pid_, 1 + mb, td, now_ns(), l, mb, b.n);
    }
  }
  for (int mb = 0; mb < m; ++mb) {
    const int64_t tw = now_ns();
    AFD_RETURN_IF_ERROR(ffn_->combine(n_layers - 1, mb, *mbs[mb]));
    if (trace_) trace_->span("wait FFN", trace_pid_, 1 + mb, tw, now_ns(), n_layers - 1, mb, mbs[mb]->n);
    attn_.add_ffn(*mbs[mb]);
  }
  times_.attention_s = attn_s;
  return Status();
}

Status PipelineEngine::forward_with_hidden(std::span<const BatchItem> items, std::vector<float>* logits,
                                           std::vector<float>* hidden) {
  const int64_t t_start = now_ns();
  AFD_RETURN_IF_ERROR(validate(items));
  const ModelConfig& c = w_->config;
  const int64_t n_items = static_cast<int64_t>(items.size());

  // Reserve KV for every item (validate() checked the blocks exist); remember old lengths.
  std::vector<int64_t> old_len(static_cast<size_t>(n_items));
  for (int64_t i = 0; i < n_items; ++i) {
    old_len[i] = kv_->length(items[i].seq_id);
    Status s = kv_->append(items[i].seq_id, static_cast<int64_t>(items[i].tokens.size()));
    if (!s.is_ok()) {
      for (int64_t j = 0; j < i; ++j) kv_->truncate(items[j].seq_id, old_len[j]);
      return s;
    }
  }

  // Assign items to micro-batches: largest first onto the lightest micro-batch.
  const int m = static_cast<int>(std::min<int64_t>(microbatches_, n_items));
  std::vector<int64_t> order(static_cast<size_t>(n_items));
  for (int64_t i = 0; i < n_items; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return items[a].tokens.size() > items[b].tokens.size(); });
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(m));
  std::vector<int64_t> load(static_cast<size_t>(m), 0);
  for (int64_t i : order) {
    int g = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    groups[g].push_back(i);
    load[g] += static_cast<int64_t>(items[i].tokens.size());
  }

  // Output rows: per item, all tokens or the last one; row offset of each item.
  std::vector<int64_t> row_off(static_cast<size_t>(n_items + 1), 0);
  for (int64_t i = 0; i < n_items; ++i)
    row_off[i + 1] = row_off[i] + (items[i].all_logits ? static_cast<int64_t>(items[i].tokens.size()) : 1);

  std::vector<TokenBatch*> mbs;
  for (int g = 0; g < m; ++g) {
    std::sort(groups[g].begin(), groups[g].end());
    TokenBatch& b = mb_storage_[g];
    b.resize(c, load[g]);
    int64_t t = 0;
    for (int64_t i : groups[g]) {
      for (size_t k = 0; k < items[i].tokens.size(); ++k, ++t) {
        b.tokens[t] = items[i].tokens[k];
        b.seq[t] = items[i].seq_id;
        b.pos[t] = old_len[i] + static_cast<int64_t>(k);
      }
    }
    mbs.push_back(&b);
  }

  ffn_->reset_times();
  expert_reads_ = 0;
  Status s = run_layers(mbs);
  if (!s.is_ok()) {
    for (int64_t i = 0; i < n_items; ++i) kv_->truncate(items[i].seq_id, old_len[i]);
    return s;
  }

  const int64_t V = c.vocab_size, H = c.hidden_size;
  logits->resize(static_cast<size_t>(row_off[n_items] * V));
  if (hidden) hidden->resize(static_cast<size_t>(row_off[n_items] * H));
  const int64_t t0 = now_ns();
  for (int g = 0; g < m; ++g) {
    std::vector<int64_t> rows, dest;
    int64_t t = 0;
    for (int64_t i : groups[g]) {
      const int64_t n = static_cast<int64_t>(items[i].tokens.size());
      for (int64_t k = 0; k < n; ++k, ++t) {
        if (items[i].all_logits || k == n - 1) {
          rows.push_back(t);
          dest.push_back(row_off[i] + (items[i].all_logits ? k : 0));
        }
      }
    }
    std::vector<float> tmp(rows.size() * V);
    attn_.logits(*mbs[g], rows, tmp.data());
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy(tmp.begin() + r * V, tmp.begin() + (r + 1) * V, logits->begin() + dest[r] * V);
    if (hidden) {
      tmp.resize(rows.size() * H);
      attn_.final_hidden(*mbs[g], rows, tmp.data());
      for (size_t r = 0; r < rows.size(); ++r)
        std::copy(tmp.begin() + r * H, tmp.begin() + (r + 1) * H, hidden->begin() + dest[r] * H);
    }
  }
  times_.attention_s += (now_ns() - t0) * 1e-9;
  // The step succeeded: record the tokens so full blocks get their prefix-cache keys.
  // Drafts wait for settle_drafts.
  for (int64_t i = 0; i < n_items; ++i) {
    const BatchItem& it = items[i];
    const size_t n_final = it.tokens.size() - static_cast<size_t>(it.n_draft);
    kv_->commit_tokens(it.seq_id, it.tokens.first(n_final));
    if (it.n_draft > 0) drafts_[it.seq_id].assign(it.tokens.begin() + n_final, it.tokens.end());
  }
  times_.ffn_s = times_.a2f_s = times_.f2a_s = 0;
  const std::vector<FfnLayerTimes>& ft = ffn_->layer_times();
  for (size_t l = 0; l < ft.size() && l < times_.layers.size(); ++l) {
    LayerStageTimes& lt = times_.layers[l];
    lt.a2f_s = ft[l].a2f_s;
    lt.ffn_s = ft[l].ffn_s;
    lt.f2a_s = ft[l].f2a_s;
    times_.a2f_s += lt.a2f_s;
    times_.ffn_s += lt.ffn_s;
    times_.f2a_s += lt.f2a_s;
  }
  times_.total_s = (now_ns() - t_start) * 1e-9;
  return Status();
}

Result<std::unique_ptr<Engine>> make_pipeline_engine(const EngineOptions& opt, std::shared_ptr<const ModelWeights> w,
                                                     std::unique_ptr<FfnBackend> ffn,
                                                     std::shared_ptr<ThreadPool> pool) {
  const ModelConfig& c = w->config;
  const bool ref = opt.precision == Precision::reference;
  KvCacheConfig kc;
  kc.n_layers = c.n_layers;
  const KvLayout kvl = kv_layout(c);
  kc.n_kv_heads = kvl.n_kv_heads;
  kc.head_dim = kvl.k_dim;
  kc.k_only = kvl.v_dim == 0;  // MLA: K-only latent rows (model/attention_variant.h)
  kc.block_size = opt.kv.block_size;
  kc.dtype = ref ? DType::f32 : opt.kv.dtype;
  kc.prefix_caching = opt.kv.prefix_caching;
  int64_t cap = opt.kv.capacity_tokens;
  if (cap == 0) {
    const int64_t max_pos = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
    cap = std::min<int64_t>(opt.kv.max_seqs * max_pos, 131072);
  }
  kc.n_blocks = (cap + kc.block_size - 1) / kc.block_size;
  AFD_ASSIGN_OR_RETURN(auto kv, PagedKvCache::create(kc));
  AttentionOptions ao;
  ao.prec = ref ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
  ao.batch_invariant = opt.batch_invariant();
  auto pe = std::make_unique<PipelineEngine>(w, std::move(kv), std::move(ffn), std::move(pool), ao, opt.pipeline_microbatches(),
                                             opt.kv.max_seqs);
  if (!opt.emulation.stage_costs_file.empty()) {
    AFD_ASSIGN_OR_RETURN(auto e, StageCostEmulation::open(opt.emulation.stage_costs_file));
    pe->set_stage_emulation(std::move(e));
  }
  if (opt.observability.trace) {
    const int pid = TraceRecorder::kAttentionPid + opt.afd.attention_index;
    pe->set_trace(opt.observability.trace, pid);
    opt.observability.trace->name_process(pid, "attention " + std::to_string(opt.afd.attention_index));
  }
  return std::unique_ptr<Engine>(std::move(pe));
}

}  // namespace afd
