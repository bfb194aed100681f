// FakeEngine: a deterministic test double of afd::Engine for scheduler and server tests.
// It keeps sequence lengths and a paged block count like a real KV cache, and produces
// logits whose argmax is next_token(last_token, new_length) = (last * 7 + len) % vocab.
// With prefix_caching set, it also remembers every whole-block prefix of tokens it has
// forwarded and reuse_prefix() maps the longest one (at most prompt size - 1) into an
// empty sequence, like a real prefix cache (block sharing is not modelled: reused tokens
// count as the sequence's own blocks). Never used by `afd serve`.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>
#include <set>
#include <vector>

#include "runtime/engine.h"

namespace afd::serve::testing {

class FakeEngine : public Engine {
 public:
  FakeEngine(int64_t vocab, int64_t max_context, int64_t blocks_total, int64_t block_size, int64_t max_seqs = 64)
      : blocks_total_(blocks_total), block_size_(block_size), max_seqs_(max_seqs) {
    cfg_.vocab_size = vocab;
    cfg_.max_position_embeddings = max_context;
    cfg_.eos_token_ids = {};
  }
  static int32_t next_token(int32_t last, int64_t len, int64_t vocab) {
    return static_cast<int32_t>((static_cast<int64_t>(last) * 7 + len) % vocab);
  }

  const ModelConfig& config() const override { return cfg_; }
  Result<int64_t> create_sequence() override {
    std::lock_guard<std::mutex> l(mu_);
    if (static_cast<int64_t>(len_.size()) >= max_seqs_) return resource_exhausted("no free sequence slot");
    int64_t id = next_id_++;
    len_[id] = 0;
    return id;
  }
  void release_sequence(int64_t id) override {
    std::lock_guard<std::mutex> l(mu_);
    len_.erase(id);
    toks_.erase(id);
  }
  int64_t reuse_prefix(int64_t id, std::span<const int32_t> prompt) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = len_.find(id);
    if (!prefix_caching || it == len_.end() || it->second != 0 || prompt.empty()) return 0;
    int64_t n = 0;
    while (n + block_size_ <= static_cast<int64_t>(prompt.size()) - 1 &&
           cached_.count(std::vector<int32_t>(prompt.begin(), prompt.begin() + n + block_size_)))
      n += block_size_;
    it->second = n;
    toks_[id].assign(prompt.begin(), prompt.begin() + n);
    reused_tokens += n;
    return n;
  }
  int64_t sequence_length(int64_t id) const override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = len_.find(id);
    return it == len_.end() ? -1 : it->second;
  }
  bool can_append(int64_t id, int64_t n) const override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = len_.find(id);
    if (it == len_.end()) return false;
    if (it->second + n > cfg_.max_position_embeddings) return false;
    int64_t extra = blocks(it->second + n) - blocks(it->second);
    const int p = pool_of(id);
    return used_blocks(p) + extra <= pool_blocks(p);
  }
  int kv_pool(int64_t id) const override {
    std::lock_guard<std::mutex> l(mu_);
    return len_.count(id) ? pool_of(id) : -1;
  }
  KvUsage kv_pool_usage(int pool) const override {
    std::lock_guard<std::mutex> l(mu_);
    return {pool_blocks(pool), used_blocks(pool), block_size_};
  }
  int64_t kv_blocks_needed(int64_t id, int64_t n) const override {
    std::lock_guard<std::mutex> l(mu_);
    if (id == kNewSequence) return blocks(n) + new_sequence_extra_blocks;
    auto it = len_.find(id);
    return it == len_.end() ? -1 : blocks(it->second + n) - blocks(it->second);
  }
  Status forward(std::span<const BatchItem> items, std::vector<float>* logits) override {
    if (int d = forward_delay_ms.load(); d > 0) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    std::lock_guard<std::mutex> l(mu_);
    ++n_forward;
    max_batch_seen = std::max<int64_t>(max_batch_seen, static_cast<int64_t>(items.size()));
    if (fail_next) {
      fail_next = false;
      return unavailable("injected engine failure");
    }
    if (fail_unavailable.load() > 0) {
      fail_unavailable.fetch_sub(1);
      return unavailable("injected: FFN worker 'ffn0' lost");
    }
    // Validate everything first: errors leave sequences unchanged.
    std::vector<int64_t> extra(static_cast<size_t>(n_pools), 0);
    for (const BatchItem& it : items) {
      auto f = len_.find(it.seq_id);
      if (f == len_.end()) return invalid_argument("unknown sequence " + std::to_string(it.seq_id));
      if (it.tokens.empty()) return invalid_argument("empty item");
      for (int32_t t : it.tokens)
        if (t < 0 || t >= cfg_.vocab_size) return invalid_argument("token outside the vocabulary");
      extra[static_cast<size_t>(pool_of(it.seq_id))] +=
          blocks(f->second + static_cast<int64_t>(it.tokens.size())) - blocks(f->second);
    }
    for (int p = 0; p < n_pools; ++p)
      if (used_blocks(p) + extra[static_cast<size_t>(p)] > pool_blocks(p))
        return resource_exhausted("KV exhausted in pool " + std::to_string(p));
    logits->assign(items.size() * static_cast<size_t>(cfg_.vocab_size), 0.0f);
    for (size_t i = 0; i < items.size(); ++i) {
      int64_t& len = len_[items[i].seq_id];
      len += static_cast<int64_t>(items[i].tokens.size());
      if (prefix_caching) {
        std::vector<int32_t>& t = toks_[items[i].seq_id];
        t.insert(t.end(), items[i].tokens.begin(), items[i].tokens.end());
        for (int64_t b = block_size_; b <= static_cast<int64_t>(t.size()); b += block_size_)
          cached_.insert(std::vector<int32_t>(t.begin(), t.begin() + b));
      }
      tokens_processed += static_cast<int64_t>(items[i].tokens.size());
      int32_t want = next_token(items[i].tokens.back(), len, cfg_.vocab_size);
      float* row = logits->data() + i * cfg_.vocab_size;
      for (int64_t j = 0; j < cfg_.vocab_size; ++j) row[j] = -0.01f * static_cast<float>(std::abs(j - want));
      row[want] = 5.0f;
    }
    return Status();
  }
  KvUsage kv_usage() const override {
    std::lock_guard<std::mutex> l(mu_);
    return {blocks_total_, used_blocks(), block_size_};
  }
  StageTimes last_stage_times() const override { return {0.001, 0, 0.002, 0, 0.003, {}}; }

  // KV pools, as a DataParallelEngine over n_pools attention engines has: sequence id i draws
  // from pool i % n_pools, each pool holding blocks_total / n_pools blocks. Set before use.
  int n_pools = 1;

  // Blocks kv_blocks_needed adds for a new sequence, as a KV manager that reserves room ahead
  // would: the scheduler must take its admission counts from the engine.
  int64_t new_sequence_extra_blocks = 0;

  int64_t live_sequences() const {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<int64_t>(len_.size());
  }

  bool prefix_caching = false;
  std::atomic<int> forward_delay_ms{0};  // each forward takes at least this long
  int64_t reused_tokens = 0;
  bool fail_next = false;
  std::atomic<int> fail_unavailable{0};  // the next n forwards fail with unavailable (a lost peer)
  std::atomic<bool> unhealthy{false};    // health() is unavailable while set
  Status health() const override { return unhealthy ? unavailable("injected: FFN worker 'ffn0' is not connected") : Status(); }
  int64_t n_forward = 0;
  int64_t max_batch_seen = 0;
  int64_t tokens_processed = 0;

 private:
  int64_t blocks(int64_t n) const { return (n + block_size_ - 1) / block_size_; }
  int pool_of(int64_t id) const { return static_cast<int>(id % n_pools); }
  int64_t pool_blocks(int pool) const { return pool >= 0 && pool < n_pools ? blocks_total_ / n_pools : 0; }
  // Blocks in use, in one pool (pool >= 0) or in all.
  int64_t used_blocks(int pool = -1) const {
    int64_t u = 0;
    for (auto& [id, n] : len_)
      if (pool < 0 || pool_of(id) == pool) u += blocks(n);
    return u;
  }
  mutable std::mutex mu_;
  ModelConfig cfg_;
  std::map<int64_t, int64_t> len_;
  std::map<int64_t, std::vector<int32_t>> toks_;  // prefix caching: tokens with KV per sequence
  std::set<std::vector<int32_t>> cached_;          // whole-block prefixes computed so far
  int64_t next_id_ = 100;
  int64_t blocks_total_, block_size_, max_seqs_;
};

}  // namespace afd::serve::testing
