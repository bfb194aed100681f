#include "core/hash.h"

#include <bit>
#include <cstring>

namespace afd {

static_assert(std::endian::native == std::endian::little, "hash64 reads 8-byte words little-endian");

namespace {
uint64_t load64(const uint8_t* p, size_t off) {
  uint64_t v;
  std::memcpy(&v, p + off, sizeof v);
  return v;
}
}  // namespace

uint64_t hash64(const void* data, size_t n, uint64_t seed) {
  // Four independent multiply-rotate lanes over 8-byte words, then a final mix.
  const uint8_t* p = static_cast<const uint8_t*>(data);
  constexpr uint64_t k1 = 0x9e3779b185ebca87ull, k2 = 0xc2b2ae3d27d4eb4full;
  uint64_t a = seed ^ n, b = seed + k1, c = seed + k2, d = seed - k1;
  auto lane = [&](uint64_t h, uint64_t w) { h += w * k2; h = (h << 31) | (h >> 33); return h * k1; };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = lane(a, load64(p, i));
    b = lane(b, load64(p, i + 8));
    c = lane(c, load64(p, i + 16));
    d = lane(d, load64(p, i + 24));
  }
  uint64_t h = ((a << 1) | (a >> 63)) + ((b << 7) | (b >> 57)) + ((c << 12) | (c >> 52)) + ((d << 18) | (d >> 46));
  for (; i + 8 <= n; i += 8) h = lane(h ^ k1, load64(p, i));
  for (; i < n; ++i) h = (h ^ p[i]) * k1;
  h ^= h >> 33; h *= k2; h ^= h >> 29; h *= k1; h ^= h >> 32;
  return h;
}

}  // namespace afd
