#include "kv/paged_kv_cache.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

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

PagedKvCache::PagedKvCache(const KvCacheConfig& cfg) : cfg_(cfg), alloc_(cfg.n_blocks) {
  size_t rows = static_cast<size_t>(cfg_.n_blocks * cfg_.block_size);
  size_t bytes = rows * row_elems() * dtype_size(cfg_.dtype);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    k_.emplace_back(new uint8_t[bytes]);
    v_.emplace_back(new uint8_t[bytes]);
    if (cfg_.dtype == DType::f8_e4m3) {
      k_scale_.emplace_back(new float[rows * cfg_.n_kv_heads]);
      v_scale_.emplace_back(new float[rows * cfg_.n_kv_heads]);
    }
  }
}

size_t PagedKvCache::bytes_per_token() const {
  size_t per_layer = 2 * row_elems() * dtype_size(cfg_.dtype);
  if (cfg_.dtype == DType::f8_e4m3) per_layer += 2 * cfg_.n_kv_heads * sizeof(float);
  return per_layer * cfg_.n_layers;
}

size_t PagedKvCache::storage_bytes() const {
  return bytes_per_token() * static_cast<size_t>(cfg_.n_blocks * cfg_.block_size);
}

Status PagedKvCache::add_sequence(int64_t seq) {
  if (seqs_.count(seq)) return invalid_argument("kv cache: sequence " + std::to_string(seq) + " exists");
  seqs_.emplace(seq, Seq{});
  return Status::ok();
}

void PagedKvCache::remove_sequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int64_t b : it->second.blocks) alloc_.release(b);
  seqs_.erase(it);
}

int64_t PagedKvCache::length(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? -1 : it->second.length;
}

int64_t PagedKvCache::blocks_needed(int64_t seq, int64_t n) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return -1;
  int64_t want = (it->second.length + n + cfg_.block_size - 1) / cfg_.block_size;
  return std::max<int64_t>(0, want - static_cast<int64_t>(it->second.blocks.size()));
}

Status PagedKvCache::append(int64_t seq, int64_t n) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return invalid_argument("kv cache: unknown sequence " + std::to_string(seq));
  int64_t need = blocks_needed(seq, n);
  if (need > alloc_.n_free())
    return resource_exhausted("kv cache: need " + std::to_string(need) + " blocks, " +
                              std::to_string(alloc_.n_free()) + " free");
  for (int64_t i = 0; i < need; ++i) it->second.blocks.push_back(alloc_.allocate());
  it->second.length += n;
  return Status::ok();
}

void PagedKvCache::truncate(int64_t seq, int64_t new_length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || new_length >= it->second.length) return;
  Seq& s = it->second;
  s.length = std::max<int64_t>(0, new_length);
  size_t keep = static_cast<size_t>((s.length + cfg_.block_size - 1) / cfg_.block_size);
  while (s.blocks.size() > keep) {
    alloc_.release(s.blocks.back());
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
      case DType::bf16: {
        auto* d = reinterpret_cast<uint16_t*>(data) + r * hd;
        for (int64_t i = 0; i < hd; ++i) d[i] = f32_to_bf16(xh[i]).bits;
        break;
      }
      default: {  // fp8 e4m3, one scale per head row
        uint8_t* d = data + r * hd;
        float amax = 0;
        for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(xh[i]));
        const float s = amax > 0 ? amax / kFp8E4M3Max : 1.0f;
        scales[r] = s;
        const float inv = 1.0f / s;
        for (int64_t i = 0; i < hd; ++i) d[i] = f32_to_fp8_e4m3(xh[i] * inv);
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
  store_row(v_[layer].get(), fp8 ? v_scale_[layer].get() : nullptr, block, slot, v);
}

void PagedKvCache::read_k(int64_t layer, int64_t seq, int64_t pos, float* out) const {
  int64_t block, slot;
  locate(seq, pos, &block, &slot);
  load_row(k_[layer].get(), cfg_.dtype == DType::f8_e4m3 ? k_scale_[layer].get() : nullptr, block, slot, out);
}

void PagedKvCache::read_v(int64_t layer, int64_t seq, int64_t pos, float* out) const {
  int64_t block, slot;
  locate(seq, pos, &block, &slot);
  load_row(v_[layer].get(), cfg_.dtype == DType::f8_e4m3 ? v_scale_[layer].get() : nullptr, block, slot, out);
}

const uint8_t* PagedKvCache::k_head(int64_t layer, int64_t block, int64_t head) const {
  return k_[layer].get() + head_row(block, head, 0) * cfg_.head_dim * dtype_size(cfg_.dtype);
}
const uint8_t* PagedKvCache::v_head(int64_t layer, int64_t block, int64_t head) const {
  return v_[layer].get() + head_row(block, head, 0) * cfg_.head_dim * dtype_size(cfg_.dtype);
}
const float* PagedKvCache::k_scales(int64_t layer, int64_t block, int64_t head) const {
  return k_scale_[layer].get() + head_row(block, head, 0);
}
const float* PagedKvCache::v_scales(int64_t layer, int64_t block, int64_t head) const {
  return v_scale_[layer].get() + head_row(block, head, 0);
}

}  // namespace afd
