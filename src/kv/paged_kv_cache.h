// PagedKvCache: K and V for every layer in fixed-size blocks; one block table per sequence.
//
// Storage per layer: [n_blocks, n_kv_heads, block_size, head_dim] for K and the same for V
// (head-major inside a block, as vLLM does, so one KV head's positions are contiguous for
// the GQA group that reads them), in `dtype`: f32 (reference mode), bf16 (default), or
// f8_e4m3 with one float scale per (block, kv head, slot) stored beside it.
// K-only layout (KvCacheConfig::k_only, MLA's latent cache): there is no V storage; the
// attention reads its values from the key rows (for DeepSeek MLA, one head of
// kv_lora_rank + qk_rope_head_dim values: the normalized latent, then the rotated rope key).
// A sequence of length L holds ceil(L / block_size) blocks.
//
// Prefix caching (KvCacheConfig::prefix_caching, as vLLM's automatic prefix caching):
// blocks are reference counted. Once the tokens of a FULL block are known (commit_tokens,
// called by the engine after a successful forward), the block is registered under the
// content key (parent key, its block_size token ids): the parent key identifies the whole
// token prefix before the block, so a key identifies the block's full token prefix exactly.
// Keys are serial numbers that are never reused, and the map compares the stored tokens and
// parent key (the 64-bit chain hash only picks the bucket), so a hash collision can cost a
// probe but never maps wrong KV. reuse_prefix() maps the longest registered chain into an
// empty sequence, taking a reference on each block. When a sequence is removed, its
// registered blocks whose reference count drops to 0 are not freed but become evictable
// (LRU, the sequence's last block first); unregistered blocks (partial, duplicates of an
// already registered content, or of a sequence whose tokens are unknown) are freed.
// Allocation takes a truly free block first, then evicts the least recently used evictable
// block (dropping its key). Invariants: only full blocks are shared or registered, and a
// sequence only writes at positions >= its committed tokens, which lie in blocks it
// allocated itself, so shared blocks are immutable and no copy-on-write is needed;
// truncate() (the rollback of a failed step) never goes below the committed tokens, so it
// never releases or reopens a shared block. fp8 scales live per block, so sharing works for
// every dtype. n_free_blocks() counts evictable blocks as available.
// Threading: reserve/release/add/remove from the engine's thread only; write_kv/read of
// distinct (sequence, position) slots may run concurrently.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kv/block_allocator.h"

namespace afd {

struct KvCacheConfig {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;   // tokens per block
  int64_t n_blocks = 0;
  DType dtype = DType::bf16;  // f32 | bf16 | f8_e4m3
  bool prefix_caching = true;  // register full blocks by content and reuse them (see above)
  bool k_only = false;  // no V rows: write() ignores v, read_v / v_head / v_scales are invalid
  bool huge_pages = true;      // ask for transparent huge pages for K/V storage (madvise)
};

// Prefix-cache counters since creation (tokens).
struct PrefixCacheStats {
  int64_t queries = 0;  // prompt tokens looked up by reuse_prefix
  int64_t hits = 0;     // of which were mapped from cached blocks
};

class PagedKvCache {
 public:
  // Validates cfg (positive sizes, supported dtype). Storage is reserved, not touched:
  // pages become resident as tokens are written.
  static Result<std::unique_ptr<PagedKvCache>> create(const KvCacheConfig& cfg);

  const KvCacheConfig& config() const { return cfg_; }
  // Bytes of K+V storage (all layers) including fp8 scales.
  size_t storage_bytes() const;
  // Bytes one token occupies across all layers (K+V, or K alone with k_only; fp8 scales included).
  size_t bytes_per_token() const;

  // Registers an empty sequence with the given id (ids are chosen by the caller).
  Status add_sequence(int64_t seq);
  // Drops the sequence's references to its blocks: registered blocks nobody else uses become
  // evictable (last block first in LRU order), the others are freed; unknown ids are ignored.
  void remove_sequence(int64_t seq);
  bool has_sequence(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Tokens currently stored for seq (-1 if unknown).
  int64_t length(int64_t seq) const;
  // Blocks needed to grow seq by n tokens (0 if they fit in its last block; -1 for an unknown seq).
  int64_t blocks_needed(int64_t seq, int64_t n) const;
  // Blocks that hold n tokens from position 0 (a new sequence with no reused prefix).
  int64_t blocks_for_tokens(int64_t n) const { return (std::max<int64_t>(n, 0) + cfg_.block_size - 1) / cfg_.block_size; }
  // Allocates blocks so that seq can hold length + n tokens, and advances its length by n.
  // On failure nothing changes (resource_exhausted).
  Status append(int64_t seq, int64_t n);
  // Undoes appended tokens back to new_length (used to roll back a failed step).
  // Precondition (internal): new_length >= committed_tokens(seq), so the blocks released
  // are never shared or registered.
  void truncate(int64_t seq, int64_t new_length);

  // --- prefix cache (no-ops when cfg.prefix_caching is false) ---
  // Records the token ids of the positions [committed, committed + tokens.size()) of seq
  // after they were computed, and registers every block that became full. If those
  // positions are not exactly the uncommitted tail [committed, length) (e.g. after
  // fill_synthetic_context wrote positions without tokens), the sequence stops being cached.
  void commit_tokens(int64_t seq, std::span<const int32_t> tokens);
  // Tokens whose ids are recorded for seq (0 when caching is off or unknown seq).
  int64_t committed_tokens(int64_t seq) const;
  // For an EMPTY sequence: maps the longest chain of registered full blocks matching the
  // start of `tokens`, at most max_tokens tokens (rounded down to whole blocks), into seq
  // (taking a reference on each block; evictable ones become used again), and returns the
  // tokens now present. 0 when nothing matched, caching is off, or seq is unknown/non-empty.
  int64_t reuse_prefix(int64_t seq, std::span<const int32_t> tokens, int64_t max_tokens);
  // Leading tokens of `tokens` that reuse_prefix would map (whole blocks), without mapping.
  int64_t match_prefix(std::span<const int32_t> tokens) const;
  PrefixCacheStats prefix_stats() const { return stats_; }
  // Registered blocks nobody references (reusable, or evicted when blocks run out).
  int64_t n_evictable_blocks() const { return static_cast<int64_t>(lru_.size()); }
  // Reference count of a block (tests and invariant checks).
  int64_t block_refs(int64_t block) const { return meta_[block].refs; }
  bool block_registered(int64_t block) const { return meta_[block].key != 0; }

  // Stores k, v [n_kv_heads * head_dim] for (layer, seq, pos). Precondition: pos < length(seq).
  // With k_only, v is not read (may be null).
  void write(int64_t layer, int64_t seq, int64_t pos, const float* k, const float* v);
  // Reads K or V of one position into out [n_kv_heads * head_dim] as f32.
  void read_k(int64_t layer, int64_t seq, int64_t pos, float* out) const;
  void read_v(int64_t layer, int64_t seq, int64_t pos, float* out) const;

  // Raw access for attention kernels: the block table of seq and the per-layer storage.
  const std::vector<int64_t>& block_table(int64_t seq) const;
  // Pointer to K (or V) of (block, kv head), slot 0: block_size * head_dim elements of dtype,
  // slot-major (slot s starts at s * head_dim).
  const uint8_t* k_head(int64_t layer, int64_t block, int64_t head) const;
  const uint8_t* v_head(int64_t layer, int64_t block, int64_t head) const;
  // fp8 only: scales [block_size] of (block, kv head). v_head / v_scales / read_v: not k_only.
  const float* k_scales(int64_t layer, int64_t block, int64_t head) const;
  const float* v_scales(int64_t layer, int64_t block, int64_t head) const;

  // Blocks an append can get: truly free plus evictable.
  int64_t n_free_blocks() const { return alloc_.n_free() + n_evictable_blocks(); }
  // Blocks referenced by live sequences.
  int64_t n_used_blocks() const { return alloc_.n_total() - n_free_blocks(); }

 private:
  struct Seq {
    int64_t length = 0;
    std::vector<int64_t> blocks;
    // Prefix cache: the committed token ids, and per full committed block the key of its
    // content (its own key, or that of the identical block registered before it).
    std::vector<int32_t> tokens;
    std::vector<uint64_t> chain;
    bool cacheable = true;  // false once positions were appended without token ids
  };
  // Content of a registered block: the key of the prefix before it and its token ids.
  struct ContentKey {
    uint64_t parent = 0;  // 0: the block starts the sequence
    std::vector<int32_t> tokens;
    bool operator==(const ContentKey& o) const { return parent == o.parent && tokens == o.tokens; }
  };
  struct ContentHash {
    size_t operator()(const ContentKey& k) const;
  };
  struct BlockMeta {
    int64_t refs = 0;
    uint64_t key = 0;  // 0: not registered
    ContentKey content;  // while registered: the entry of cached_ that maps to this block
    std::list<int64_t>::iterator lru;  // valid while refs == 0 and registered
  };
  // A truly free block, else the least recently used evictable one (its key is dropped);
  // -1 when neither exists. The returned block has refs == 1.
  int64_t take_block();
  // Drops one reference; at 0 a registered block becomes evictable, others are freed.
  void unref(int64_t block);
  // Looks up the block registered for (parent, tokens); -1 if none.
  int64_t find_block(uint64_t parent, std::span<const int32_t> tokens) const;
  size_t row_elems() const { return static_cast<size_t>(cfg_.n_kv_heads * cfg_.head_dim); }
  // Index of (block, head, slot) in units of head rows (head_dim elements / one scale).
  size_t head_row(int64_t block, int64_t head, int64_t slot) const {
    return static_cast<size_t>((block * cfg_.n_kv_heads + head) * cfg_.block_size + slot);
  }
  explicit PagedKvCache(const KvCacheConfig& cfg);
  // Scatter / gather one token's K or V [n_kv_heads * head_dim] into its head rows.
  void store_row(uint8_t* data, float* scales, int64_t block, int64_t slot, const float* x);
  void load_row(const uint8_t* data, const float* scales, int64_t block, int64_t slot, float* out) const;
  void locate(int64_t seq, int64_t pos, int64_t* block, int64_t* slot) const;

  KvCacheConfig cfg_;
  BlockAllocator alloc_;
  std::unordered_map<int64_t, Seq> seqs_;
  std::vector<BlockMeta> meta_;
  std::list<int64_t> lru_;  // evictable blocks, least recently used first
  std::unordered_map<ContentKey, int64_t, ContentHash> cached_;  // content -> block
  uint64_t next_key_ = 1;
  PrefixCacheStats stats_;
  // Per layer; uninitialised until written.
  std::vector<std::unique_ptr<uint8_t[]>> k_, v_;
  std::vector<std::unique_ptr<float[]>> k_scale_, v_scale_;  // fp8 only
};

}  // namespace afd
