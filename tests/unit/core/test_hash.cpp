// hash64's values are part of the wire format (frame checksums) and of the model
// fingerprint: pinned here for inputs that reach every branch (the 32-byte lanes, the
// 8-byte tail words, the byte tail).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/hash.h"

namespace afd::test_hash {
namespace {

std::vector<uint8_t> pattern() {
  std::vector<uint8_t> b(100);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 7 + 1);
  return b;
}

TEST(Hash64, PinnedValues) {
  const std::vector<uint8_t> b = pattern();
  const struct {
    size_t n;
    uint64_t want;
  } cases[] = {{0, 0x681a6d7b72625f5full},  {1, 0x8c843b2e62fd73b6ull},  {7, 0xf3ef0ea81290d9c0ull},
               {8, 0x82631fa5dd265957ull},  {31, 0xa3455eb421a975e5ull}, {32, 0x6f068ed9d596c18full},
               {33, 0x10b05193e2877628ull}, {100, 0x23ffdfb5873da2e5ull}};
  for (const auto& c : cases) EXPECT_EQ(hash64(b.data(), c.n), c.want) << c.n << " bytes";
  EXPECT_EQ(hash64(b.data(), b.size(), 42), 0x9bf0df3f3ab5bf7dull);
}

TEST(Hash64, SeedAndEveryByteMatter) {
  std::vector<uint8_t> b = pattern();
  const uint64_t h = hash64(b.data(), b.size());
  EXPECT_NE(hash64(b.data(), b.size(), 1), h);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] ^= 1;
    EXPECT_NE(hash64(b.data(), b.size()), h) << "byte " << i;
    b[i] ^= 1;
  }
}

}  // namespace
}  // namespace afd::test_hash
