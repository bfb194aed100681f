#include "serve/structured/utf8_ranges.h"

#include <algorithm>

#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateFirst = 0xD800, kSurrogateLast = 0xDFFF;

// lo and hi encode to the same length n.
void sequences_same_length(uint32_t lo, uint32_t hi, int n, std::vector<ByteRangeSeq>* out) {
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;  // the bits of the last i bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        sequences_same_length(lo, lo | m, n, out);
        sequences_same_length((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        sequences_same_length(lo, (hi & ~m) - 1, n, out);
        sequences_same_length(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  std::string a, b;
  utf8_append(&a, lo);
  utf8_append(&b, hi);
  ByteRangeSeq seq;
  for (size_t i = 0; i < a.size(); ++i) seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  out->push_back(std::move(seq));
}

}  // namespace

std::vector<CodePointRange> normalize_code_points(std::vector<CodePointRange> ranges) {
  std::vector<CodePointRange> cut;
  for (auto [lo, hi] : ranges) {
    if (lo > hi || lo > kMaxCodePoint) continue;
    hi = std::min(hi, kMaxCodePoint);
    if (hi < kSurrogateFirst || lo > kSurrogateLast) {
      cut.push_back({lo, hi});
      continue;
    }
    if (lo < kSurrogateFirst) cut.push_back({lo, kSurrogateFirst - 1});
    if (hi > kSurrogateLast) cut.push_back({kSurrogateLast + 1, hi});
  }
  std::sort(cut.begin(), cut.end());
  std::vector<CodePointRange> merged;
  for (auto r : cut) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

std::vector<CodePointRange> complement_code_points(const std::vector<CodePointRange>& normalized) {
  std::vector<CodePointRange> out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalized) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalize_code_points(std::move(out));
}

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>* out) {
  static constexpr uint32_t kLast[4] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  uint32_t first = 0;
  for (int n = 1; n <= 4; ++n) {
    const uint32_t a = std::max(lo, first), b = std::min(hi, kLast[n - 1]);
    if (a <= b) sequences_same_length(a, b, n, out);
    first = kLast[n - 1] + 1;
  }
}


}  // namespace afd::serve
