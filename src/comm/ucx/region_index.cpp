#include "comm/ucx/region_index.h"

#include <algorithm>

namespace afd::comm::ucx {

void RegionIndex::add(void* base, size_t size, uint64_t id, void* handle) {
  const auto b = reinterpret_cast<uintptr_t>(base);
  auto at = std::upper_bound(ranges_.begin(), ranges_.end(), b, [](uintptr_t x, const Range& r) { return x < r.base; });
  ranges_.insert(at, Range{b, size, id, handle});
  max_size_ = std::max(max_size_, size);
}

void* RegionIndex::remove(void* base, uint64_t id) {
  const auto b = reinterpret_cast<uintptr_t>(base);
  for (auto it = ranges_.begin(); it != ranges_.end(); ++it) {
    if (it->base == b && it->id == id) {
      void* h = it->handle;
      ranges_.erase(it);
      return h;
    }
  }
  return nullptr;
}

void* RegionIndex::find(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  // Ranges with base <= a, nearest first; one that starts more than max_size_ below a
  // cannot contain it, nor can any before it.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), a, [](uintptr_t x, const Range& r) { return x < r.base; });
  while (it != ranges_.begin()) {
    --it;
    if (a - it->base > max_size_) break;
    if (a + n <= it->base + it->size) return it->handle;
  }
  return nullptr;
}

std::vector<void*> RegionIndex::take_all() {
  std::vector<void*> hs;
  hs.reserve(ranges_.size());
  for (const Range& r : ranges_) hs.push_back(r.handle);
  ranges_.clear();
  return hs;
}

}  // namespace afd::comm::ucx
