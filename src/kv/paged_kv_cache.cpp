#include "kv/paged_kv_cache.h"

#include <algorithm>
#include <cmath>

#include <sys/mman.h>

#include "core/check.h"
#include "kernels/cpu/ops.h"

namespace afd {

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::create(const KvCacheConfig& cfg) {
  if (cfg.n_layers <= 0 || cfg.n_kv_heads <= 0 || cfg.head_dim <= 0 || cfg.block_size <= 0 ||
      cfg.n_blocks <= 0)
    return invalid_argument("kv cache: layers, kv heads, head_dim, block_size and n_blocks must be positive");
  if (cfg.dtype != DType::f32 && cfg.dtype != DType::bf16 && cfg.dtype != DType::f8_e4m3)
    return invalid_argument(std::string("kv cache: unsupported dtype ") + dtype_name(cfg.dtype) +
                            " (f32, bf16 or f8_e4m3)");
  return std::unique_ptr<PagedKvCache>(new PagedKvCache(cfg));
}

namespace {
// Asks for transparent huge pages on the 2 MiB-aligned interior of [p, p + bytes): attention
// reads one kv head's page run (block_size * head_dim elements, 4 KiB for bf16 x 128) per
// block, n_kv_heads runs apart, so with 4 KiB pages nearly every run is a TLB miss.
// on: KvCacheConfig::huge_pages.
void advise_huge_pages(uint8_t* p, size_t bytes, bool on) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (on && e > b) (void)madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
}
}  // namespace

PagedKvCache::PagedKvCache(const KvCacheConfig& cfg)
    : cfg_(cfg), alloc_(cfg.n_blocks), meta_(static_cast<size_t>(cfg.n_blocks)) {
  size_t rows = static_cast<size_t>(cfg_.n_blocks * cfg_.block_size);
  size_t bytes = rows * row_elems() * dtype_size(cfg_.dtype);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    k_.emplace_back(new uint8_t[bytes]);
    advise_huge_pages(k_.back().get(), bytes, cfg_.huge_pages);
    if (!cfg_.k_only) {
      v_.emplace_back(new uint8_t[bytes]);
      advise_huge_pages(v_.back().get(), bytes, cfg_.huge_pages);
    }
    if (cfg_.dtype == DType::f8_e4m3) {
      k_scale_.emplace_back(new float[rows * cfg_.n_kv_heads]);
      if (!cfg_.k_only) v_scale_.emplace_back(new float[rows * cfg_.n_kv_heads]);
    }
  }
}

size_t PagedKvCache::bytes_per_token() const {
  const size_t planes = cfg_.k_only ? 1 : 2;  // K and V rows, or K alone
  size_t per_layer = planes * row_elems() * dtype_size(cfg_.dtype);
  if (cfg_.dtype == DType::f8_e4m3) per_layer += planes * cfg_.n_kv_heads * sizeof(float);
  return per_layer * cfg_.n_layers;
}

size_t PagedKvCache::storage_bytes() const {
  return bytes_per_token() * static_cast<size_t>(cfg_.n_blocks * cfg_.block_size);
}

Status PagedKvCache::add_sequence(int64_t seq) {
  if (seqs_.count(seq)) return invalid_argument("kv cache: sequence " + std::to_string(seq) + " exists");
  seqs_.emplace(seq, Seq{});
  return Status();
}

void PagedKvCache::remove_sequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Last block first: it enters the LRU list first, so it is evicted before the blocks
  // its chain depends on (a child without its parent can no longer be found).
  const std::vector<int64_t>& bl = it->second.blocks;
  for (auto b = bl.rbegin(); b != bl.rend(); ++b) unref(*b);
  seqs_.erase(it);
}

size_t PagedKvCache::ContentHash::operator()(const ContentKey& k) const {
  // FNV-1a style chain over the parent key and the token ids; only selects the bucket
  // (equality compares the full content).
  uint64_t h = 1469598103934665603ULL ^ (k.parent * 0x9E3779B97F4A7C15ULL);
  for (int32_t t : k.tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ULL;
  }
  return static_cast<size_t>(h ^ (h >> 29));
}

int64_t PagedKvCache::take_block() {
  int64_t b = alloc_.allocate();
  if (b < 0) {
    if (lru_.empty()) return -1;
    b = lru_.front();
    lru_.pop_front();
    BlockMeta& m = meta_[b];
    AFD_CHECK(m.refs == 0 && m.key != 0, "evictable block must be registered and unreferenced");
    cached_.erase(m.content);
    m.key = 0;
    m.content = ContentKey{};
  }
  AFD_CHECK(meta_[b].refs == 0 && meta_[b].key == 0, "a taken block must be unreferenced and unregistered");
  meta_[b].refs = 1;
  return b;
}

void PagedKvCache::unref(int64_t block) {
  BlockMeta& m = meta_[block];
  AFD_CHECK(m.refs > 0, "block reference count underflow");
  if (--m.refs > 0) return;
  if (m.key != 0) {
    m.lru = lru_.insert(lru_.end(), block);
  } else {
    alloc_.release(block);
  }
}

int64_t PagedKvCache::find_block(uint64_t parent, std::span<const int32_t> tokens) const {
  ContentKey k{parent, std::vector<int32_t>(tokens.begin(), tokens.end())};
  auto it = cached_.find(k);
  return it == cached_.end() ? -1 : it->second;
}

void PagedKvCache::commit_tokens(int64_t seq, std::span<const int32_t> tokens) {
  if (!cfg_.prefix_caching) return;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Seq& s = it->second;
  if (!s.cacheable) return;
  if (static_cast<int64_t>(s.tokens.size() + tokens.size()) != s.length) {
    // Positions without known token ids: this sequence's later blocks cannot be keyed.
    s.cacheable = false;
    s.tokens.clear();
    s.tokens.shrink_to_fit();
    return;
  }
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  const int64_t bs = cfg_.block_size;
  const int64_t full = static_cast<int64_t>(s.tokens.size()) / bs;
  for (int64_t i = static_cast<int64_t>(s.chain.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : s.chain[i - 1];
    std::span<const int32_t> bt(s.tokens.data() + i * bs, static_cast<size_t>(bs));
    const int64_t b = s.blocks[i];
    AFD_CHECK(meta_[b].key == 0, "a block past the committed chain is never registered");
    const int64_t existing = find_block(parent, bt);
    if (existing >= 0) {
      // The same content was registered first by another sequence: this copy stays
      // private (freed with the sequence); the chain continues under the existing key.
      s.chain.push_back(meta_[existing].key);
      continue;
    }
    BlockMeta& m = meta_[b];
    m.key = next_key_++;
    m.content = ContentKey{parent, std::vector<int32_t>(bt.begin(), bt.end())};
    cached_.emplace(m.content, b);
    s.chain.push_back(m.key);
  }
}

int64_t PagedKvCache::committed_tokens(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.tokens.size());
}

int64_t PagedKvCache::match_prefix(std::span<const int32_t> tokens) const {
  if (!cfg_.prefix_caching) return 0;
  const int64_t bs = cfg_.block_size;
  uint64_t parent = 0;
  int64_t n = 0;
  while (n + bs <= static_cast<int64_t>(tokens.size())) {
    const int64_t b = find_block(parent, tokens.subspan(static_cast<size_t>(n), static_cast<size_t>(bs)));
    if (b < 0) break;
    parent = meta_[b].key;
    n += bs;
  }
  return n;
}

int64_t PagedKvCache::reuse_prefix(int64_t seq, std::span<const int32_t> tokens, int64_t max_tokens) {
  if (!cfg_.prefix_caching) return 0;
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.length != 0 || !it->second.blocks.empty()) return 0;
  Seq& s = it->second;
  const int64_t bs = cfg_.block_size;
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  stats_.queries += static_cast<int64_t>(tokens.size());
  uint64_t parent = 0;
  while (s.length + bs <= limit) {
    std::span<const int32_t> bt = tokens.subspan(static_cast<size_t>(s.length), static_cast<size_t>(bs));
    const int64_t b = find_block(parent, bt);
    if (b < 0) break;
    BlockMeta& m = meta_[b];
    if (m.refs == 0) lru_.erase(m.lru);  // evictable -> used again
    ++m.refs;
    s.blocks.push_back(b);
    s.chain.push_back(m.key);
    s.tokens.insert(s.tokens.end(), bt.begin(), bt.end());
    s.length += bs;
    parent = m.key;
  }
  stats_.hits += s.length;
  return s.length;
}

int64_t PagedKvCache::length(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? -1 : it->second.length;
}

int64_t PagedKvCache::blocks_needed(int64_t seq, int64_t n) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return -1;
  const int64_t want = blocks_for_tokens(it->second.length + n);
  return std::max<int64_t>(0, want - static_cast<int64_t>(it->second.blocks.size()));
}

Status PagedKvCache::append(int64_t seq, int64_t n) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return invalid_argument("kv cache: unknown sequence " + std::to_string(seq));
  int64_t need = blocks_needed(seq, n);
  if (need > n_free_blocks())
    return resource_exhausted("kv cache: need " + std::to_string(need) + " blocks, " +
                              std::to_string(n_free_blocks()) + " free");
  for (int64_t i = 0; i < need; ++i) it->second.blocks.push_back(take_block());
  it->second.length += n;
  return Status();
}

void PagedKvCache::truncate(int64_t seq, int64_t new_length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || new_length >= it->second.length) return;
  Seq& s = it->second;
  s.length = std::max<int64_t>(0, new_length);
  AFD_CHECK(s.length >= static_cast<int64_t>(s.tokens.size()), "truncate below the committed tokens");
  size_t keep = static_cast<size_t>((s.length + cfg_.block_size - 1) / cfg_.block_size);
  while (s.blocks.size() > keep) {
    // Past the committed tokens: allocated by this sequence, never shared or registered.
    AFD_CHECK(meta_[s.blocks.back()].refs == 1 && meta_[s.blocks.back()].key == 0, "truncate of a shared block");
    unref(s.blocks.back());
    s.blocks.pop_back();
  }
}

const std::vector<int64_t>& PagedKvCache::block_table(int64_t seq) const {
  auto it = seqs_.find(seq);
  AFD_CHECK(it != seqs_.end(), "unknown sequence");
  return it->second.blocks;
}

void PagedKvCache::locate(int64_t seq, int64_t pos, int64_t* block, int64_t* slot) const {
  auto it = seqs_.find(seq);
  AFD_CHECK(it != seqs_.end() && pos >= 0 && pos < it->second.length, "kv position out of range");
  *block = it->second.blocks[pos / cfg_.block_size];
  *slot = pos % cfg_.block_size;
}

void PagedKvCache::store_row(uint8_t* data, float* scales, int64_t block, int64_t slot, const float* x) {
  const int64_t hd = cfg_.head_dim;
  for (int64_t h = 0; h < cfg_.n_kv_heads; ++h) {
    const size_t r = head_row(block, h, slot);
    const float* xh = x + h * hd;
    switch (cfg_.dtype) {
      case DType::f32:
        std::memcpy(reinterpret_cast<float*>(data) + r * hd, xh, static_cast<size_t>(hd) * 4);
        break;
      case DType::bf16:
        kernels::f32_to_bf16_row(xh, hd, reinterpret_cast<uint16_t*>(data) + r * hd);
        break;
      default: {  // fp8 e4m3, one scale per head row
        uint8_t* d = data + r * hd;
        const float amax = kernels::abs_max(xh, hd);
        const float s = amax > 0 ? amax / kFp8E4M3Max : 1.0f;
        scales[r] = s;
        kernels::scale_to_fp8_e4m3(xh, hd, 1.0f / s, d);
      }
    }
  }
}

void PagedKvCache::load_row(const uint8_t* data, const float* scales, int64_t block, int64_t slot,
                            float* out) const {
  const int64_t hd = cfg_.head_dim;
  for (int64_t h = 0; h < cfg_.n_kv_heads; ++h) {
    const size_t r = head_row(block, h, slot);
    float* oh = out + h * hd;
    switch (cfg_.dtype) {
      case DType::f32:
        std::memcpy(oh, reinterpret_cast<const float*>(data) + r * hd, static_cast<size_t>(hd) * 4);
        break;
      case DType::bf16: {
        auto* d = reinterpret_cast<const uint16_t*>(data) + r * hd;
        for (int64_t i = 0; i < hd; ++i) oh[i] = bf16_to_f32(d[i]);
        break;
      }
      default: {
        const uint8_t* d = data + r * hd;
        const float s = scales[r];
        for (int64_t i = 0; i < hd; ++i) oh[i] = fp8_e4m3_to_f32(d[i]) * s;
      }
    }
  }
}

void PagedKvCache::write(int64_t layer, int64_t seq, int64_t pos, const float* k, const float* v) {
  int64_t block, slot;
  locate(seq, pos, &block, &slot);
  bool fp8 = cfg_.dtype == DType::f8_e4m3;
  store_row(k_[layer].get(), fp8 ? k_scale_[layer].get() : nullptr, block, slot, k);
  if (!cfg_.k_only) store_row(v_[layer].get(), fp8 ? v_scale_[layer].get() : nullptr, block, slot, v);
}

void PagedKvCache::read_k(int64_t layer, int64_t seq, int64_t pos, float* out) const {
  int64_t block, slot;
  locate(seq, pos, &block, &slot);
  load_row(k_[layer].get(), cfg_.dtype == DType::f8_e4m3 ? k_scale_[layer].get() : nullptr, block, slot, out);
}

void PagedKvCache::read_v(int64_t layer, int64_t seq, int64_t pos, float* out) const {
  AFD_CHECK(!cfg_.k_only, "read_v on a K-only KV cache");
  int64_t block, slot;
  locate(seq, pos, &block, &slot);
  load_row(v_[layer].get(), cfg_.dtype == DType::f8_e4m3 ? v_scale_[layer].get() : nullptr, block, slot, out);
}

const uint8_t* PagedKvCache::k_head(int64_t layer, int64_t block, int64_t head) const {
  return k_[layer].get() + head_row(block, head, 0) * cfg_.head_dim * dtype_size(cfg_.dtype);
}
const uint8_t* PagedKvCache::v_head(int64_t layer, int64_t block, int64_t head) const {
  AFD_CHECK(!cfg_.k_only, "v_head on a K-only KV cache");
  return v_[layer].get() + head_row(block, head, 0) * cfg_.head_dim * dtype_size(cfg_.dtype);
}
const float* PagedKvCache::k_scales(int64_t layer, int64_t block, int64_t head) const {
  return k_scale_[layer].get() + head_row(block, head, 0);
}
const float* PagedKvCache::v_scales(int64_t layer, int64_t block, int64_t head) const {
  AFD_CHECK(!cfg_.k_only, "v_scales on a K-only KV cache");
  return v_scale_[layer].get() + head_row(block, head, 0);
}

}  // namespace afd
