// Bundle: the engines of one AFD deployment as seen from this process.
//
//   local (topology xAyF, no remote FFN addresses): y FfnWorkers on their own threads and
//     x attention engines (PipelineEngine + FfnClient), all over one in-process hub —
//     the single-process default and what the equivalence tests use.
//   remote (ffn_addresses given): this process hosts attention worker(s); the FFN workers
//     are `afd worker --role ffn` processes reached over UCX, started in any order.
//
// DataParallelEngine presents the x attention engines as one Engine: a new sequence goes
// to the engine with the least token load (KV blocks in use, the A/F ratio paper, §5.3; ties: fewest
// live sequences); forward() runs
// every engine's share of the batch concurrently and returns logits in item order.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/transport.h"
#include "runtime/engine.h"
#include "runtime/engine_options.h"
#include "runtime/afd/ffn_worker.h"
#include "runtime/topology.h"

namespace afd {

struct ModelWeights;

class Bundle {
 public:
  // The bundle of opt.topology (AFD or EP wiring) with TP degree opt.afd.ffn_tp.
  static Result<std::unique_ptr<Bundle>> create(const EngineOptions& opt, std::shared_ptr<const ModelWeights> w);
  ~Bundle();  // stops the local FFN workers (engines must be destroyed first: Bundle owns them)

  std::vector<std::unique_ptr<Engine>>& attention() { return attention_; }
  const Topology& topology() const { return topo_; }
  // The topology's index of attention()[0] (the others follow): 0 in one process; a
  // worker process's --attention-index when the FFN workers are remote.
  int first_attention_index() const { return first_attention_index_; }
  // Local FFN workers' statistics (empty for a remote bundle).
  std::vector<const FfnWorkerStats*> ffn_stats() const;
  // Local FFN workers (empty for a remote bundle), in shard order.
  const std::vector<std::unique_ptr<FfnWorker>>& ffn_workers() const { return ffn_; }
  // The attention engines' FFN clients (their membership: metrics, the admin endpoint).
  std::vector<class FfnClient*> ffn_clients() const;
  // Ends local FFN worker j as if its thread had died: stops it and closes its transport, so
  // the attention engines see the loss (and, with a takeover time, move its experts to the
  // others). Also what happens when the worker's thread fails (an exception escaping run()).
  // Its statistics stay readable. invalid_argument for a remote bundle or a bad index.
  Status fail_ffn_worker(int j, const std::string& why);

 private:
  Bundle() = default;
  Topology topo_;
  int first_attention_index_ = 0;
  std::vector<std::unique_ptr<comm::Transport>> transports_;  // FFN side first, then attention
  std::vector<std::unique_ptr<FfnWorker>> ffn_;
  std::unique_ptr<std::atomic<bool>[]> ffn_stop_;  // [y]: stops worker j alone (fail_ffn_worker)
  std::vector<class FfnClient*> clients_;
  std::vector<std::unique_ptr<ThreadPool>> ffn_pools_;
  std::vector<std::thread> ffn_threads_;
  std::vector<std::unique_ptr<Engine>> attention_;
};

// Known gap: when one attention engine's share of a batch fails (e.g. its FFN peer is
// lost), the shares of the other engines have already advanced their sequences, so
// Engine::forward's "unchanged on error" holds per engine, not for the whole batch; callers
// (the scheduler, generate) fail every sequence of a failed batch.
class DataParallelEngine : public Engine, public BenchmarkHooks {
 public:
  explicit DataParallelEngine(std::unique_ptr<Bundle> bundle);
  ~DataParallelEngine() override;

  const ModelConfig& config() const override { return engines()[0]->config(); }
  Result<int64_t> create_sequence() override;
  void release_sequence(int64_t seq_id) override;
  int64_t sequence_length(int64_t seq_id) const override;
  bool can_append(int64_t seq_id, int64_t n_tokens) const override;
  int64_t kv_blocks_needed(int64_t seq_id, int64_t n_tokens) const override;
  int kv_pool(int64_t seq_id) const override;
  KvUsage kv_pool_usage(int pool) const override;
  // Prefix-aware placement: an empty sequence moves to the attention engine whose prefix
  // cache holds the longest part of `prompt` (if that engine can take one more sequence),
  // then the call is forwarded to the engine that holds it. create_sequence() alone can
  // only balance by load, since it does not see the prompt.
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
  Status health() const override;
  Bundle& bundle() { return *bundle_; }
  BenchmarkHooks* benchmark_hooks() override { return this; }
  // The first attention engine's pool.
  std::shared_ptr<ThreadPool> compute_pool() const override { return engines()[0]->compute_pool(); }
  // BenchmarkHooks, over the attention engines' own.
  Status fill_synthetic_context(int64_t seq_id, int64_t n_tokens) override;
  int64_t last_expert_reads() const override;
  std::vector<int64_t> last_engine_tokens() const override { return last_tokens_; }
  std::vector<const FfnWorkerStats*> ffn_stats() const override { return bundle_->ffn_stats(); }

 private:
  struct Placement {
    int engine = 0;
    int64_t inner = -1;
  };
  const std::vector<std::unique_ptr<Engine>>& engines() const { return bundle_->attention(); }
  const Placement* find(int64_t seq) const;

  std::unique_ptr<Bundle> bundle_;
  std::unordered_map<int64_t, Placement> seqs_;  // outer id -> engine and its id
  int64_t next_id_ = 0;
  std::vector<int64_t> live_;  // live sequences per engine (tie-break of the placement)
  StageTimes times_;
  std::vector<int64_t> last_tokens_;
};

}  // namespace afd
