// PipelineEngine: the one Engine implementation. Attention (embedding, attention halves,
// LM head, KV cache) runs here; each layer's FFN half goes to an FfnBackend. Monolithic,
// AFD and EP are different backends, so every wiring shares this code and its tests.
//
// A forward pass splits its items into m micro-batches (balanced by token count; an item
// is never split) and streams them layer by layer:
//   for layer l: for mb: [combine(l-1, mb); x += ffn_out]; attention(l, mb); dispatch(l, mb)
// so attention of one micro-batch overlaps the FFN and transfers of the others.
#pragma once

#include <memory>
#include <unordered_map>

#include "core/thread_pool.h"
#include "kv/paged_kv_cache.h"
#include "model/attention_part.h"
#include "runtime/engine.h"
#include "runtime/engine_options.h"
#include "runtime/ffn_backend.h"
#include "runtime/stage_emulation.h"
#include "runtime/trace.h"

namespace afd {

class PipelineEngine : public Engine, public BenchmarkHooks {
 public:
  // max_seqs: live sequences at most; microbatches in [1, 4].
  PipelineEngine(std::shared_ptr<const ModelWeights> w, std::unique_ptr<PagedKvCache> kv,
                 std::unique_ptr<FfnBackend> ffn, std::shared_ptr<ThreadPool> pool, AttentionOptions attn_opt,
                 int microbatches, int64_t max_seqs);

  const ModelConfig& config() const override { return w_->config; }
  Result<int64_t> create_sequence() override;
  void release_sequence(int64_t seq_id) override;
  int64_t sequence_length(int64_t seq_id) const override { return kv_->length(seq_id); }
  bool can_append(int64_t seq_id, int64_t n_tokens) const override;
  int64_t kv_blocks_needed(int64_t seq_id, int64_t n_tokens) const override;
  int64_t reuse_prefix(int64_t seq_id, std::span<const int32_t> prompt) override;
  int64_t cached_prefix(std::span<const int32_t> prompt) const override;
  Status forward(std::span<const BatchItem> items, std::vector<float>* logits) override {
    return forward_with_hidden(items, logits, nullptr);
  }
  // hidden may be null (forward()).
  Status forward_with_hidden(std::span<const BatchItem> items, std::vector<float>* logits,
                             std::vector<float>* hidden) override;
  Status settle_drafts(int64_t seq_id, int64_t n_accepted) override;
  KvUsage kv_usage() const override;
  StageTimes last_stage_times() const override { return times_; }
  Status health() const override { return ffn_->health(); }
  BenchmarkHooks* benchmark_hooks() override { return this; }
  std::shared_ptr<ThreadPool> compute_pool() const override { return pool_; }

  const PagedKvCache& kv_cache() const { return *kv_; }
  // Records attention and FFN-wait spans as pid `pid` (tracing; null to stop).
  void set_trace(std::shared_ptr<TraceRecorder> trace, int pid) { trace_ = std::move(trace); trace_pid_ = pid; }
  // Emulated attention cost after each micro-batch's attention of a layer (null: none).
  void set_stage_emulation(std::shared_ptr<StageCostEmulation> e) { emulation_ = std::move(e); }
  // BenchmarkHooks: the synthetic K/V are deterministic small values.
  Status fill_synthetic_context(int64_t seq_id, int64_t n_tokens) override;
  // Expert weight matrices (gate+up+down counted as one expert) read in the last forward:
  // the sum over (layer, micro-batch) of distinct experts routed to.
  int64_t last_expert_reads() const override { return expert_reads_; }
  int microbatches() const { return microbatches_; }

 private:
  Status validate(std::span<const BatchItem> items) const;
  Status run_layers(std::vector<TokenBatch*>& mbs);

  std::shared_ptr<const ModelWeights> w_;
  std::unique_ptr<PagedKvCache> kv_;
  std::unique_ptr<FfnBackend> ffn_;
  std::shared_ptr<ThreadPool> pool_;
  AttentionPart attn_;
  std::shared_ptr<StageCostEmulation> emulation_;
  int microbatches_;
  int64_t max_seqs_;
  int64_t next_seq_ = 0;
  int64_t n_live_ = 0;
  // Draft tokens of the last forward per sequence, until settle_drafts (their KV is written,
  // their ids are not yet committed to the prefix cache).
  std::unordered_map<int64_t, std::vector<int32_t>> drafts_;
  std::vector<TokenBatch> mb_storage_;
  StageTimes times_;
  int64_t expert_reads_ = 0;
  std::shared_ptr<TraceRecorder> trace_;
  int trace_pid_ = 1;
};

// One attention engine (KV cache sized by opt.kv, attention half in opt.precision, the
// wiring's micro-batch count) over the given FFN backend; with opt.observability.trace it
// records as attention worker opt.afd.attention_index.
Result<std::unique_ptr<Engine>> make_pipeline_engine(const EngineOptions& opt, std::shared_ptr<const ModelWeights> w,
                                                     std::unique_ptr<FfnBackend> ffn,
                                                     std::shared_ptr<ThreadPool> pool);

}  // namespace afd
