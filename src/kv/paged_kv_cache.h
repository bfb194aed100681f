// PagedKvCache: K and V for every layer in fixed-size blocks; one block table per sequence.
//
// Storage per layer: [n_blocks, n_kv_heads, block_size, head_dim] for K and the same for V
// (head-major inside a block, as vLLM does, so one KV head's positions are contiguous for
// the GQA group that reads them), in `dtype`: f32 (reference mode), bf16 (default), or
// f8_e4m3 with one float scale per (block, kv head, slot) stored beside it.
// A sequence of length L holds ceil(L / block_size) blocks; they are freed with the sequence.
// Threading: reserve/release/add/remove from the engine's thread only; write_kv/read of
// distinct (sequence, position) slots may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
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
};

class PagedKvCache {
 public:
  // Validates cfg (positive sizes, supported dtype). Storage is reserved, not touched:
  // pages become resident as tokens are written.
  static Result<std::unique_ptr<PagedKvCache>> create(const KvCacheConfig& cfg);

  const KvCacheConfig& config() const { return cfg_; }
  // Bytes of K+V storage (all layers) including fp8 scales.
  size_t storage_bytes() const;
  // Bytes one token occupies across all layers (K+V).
  size_t bytes_per_token() const;

  // Registers an empty sequence with the given id (ids are chosen by the caller).
  Status add_sequence(int64_t seq);
  // Frees all blocks of the sequence; unknown ids are ignored.
  void remove_sequence(int64_t seq);
  bool has_sequence(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Tokens currently stored for seq (-1 if unknown).
  int64_t length(int64_t seq) const;
  // Blocks needed to grow seq by n tokens (0 if they fit in its last block).
  int64_t blocks_needed(int64_t seq, int64_t n) const;
  // Allocates blocks so that seq can hold length + n tokens, and advances its length by n.
  // On failure nothing changes (resource_exhausted).
  Status append(int64_t seq, int64_t n);
  // Undoes the last n appended tokens (used to roll back a failed step).
  void truncate(int64_t seq, int64_t new_length);

  // Stores k, v [n_kv_heads * head_dim] for (layer, seq, pos). Precondition: pos < length(seq).
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
  // fp8 only: scales [block_size] of (block, kv head).
  const float* k_scales(int64_t layer, int64_t block, int64_t head) const;
  const float* v_scales(int64_t layer, int64_t block, int64_t head) const;

  int64_t n_free_blocks() const { return alloc_.n_free(); }
  int64_t n_used_blocks() const { return alloc_.n_total() - alloc_.n_free(); }

 private:
  struct Seq {
    int64_t length = 0;
    std::vector<int64_t> blocks;
  };
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
  // Per layer; uninitialised until written.
  std::vector<std::unique_ptr<uint8_t[]>> k_, v_;
  std::vector<std::unique_ptr<float[]>> k_scale_, v_scale_;  // fp8 only
};

}  // namespace afd
