// Code-point ranges as UTF-8 byte-range sequences: how a character class of a grammar over text
// becomes byte terminals (a token may end inside a code point, so matching is per byte).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace afd::serve {

using CodePointRange = std::pair<uint32_t, uint32_t>;           // [first, last]
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;  // one [lo, hi] per byte position

// Sorted, merged ranges of Unicode scalar values (surrogates D800-DFFF and values past 10FFFF removed).
std::vector<CodePointRange> normalize_code_points(std::vector<CodePointRange> ranges);
// The scalar values not in `ranges` (normalized).
std::vector<CodePointRange> complement_code_points(const std::vector<CodePointRange>& normalized);
// Byte-range sequences whose union is exactly the UTF-8 encodings of the scalar values in [lo, hi]
// (no surrogates inside the range): each sequence matches bytes b0..bn with b_i in [lo_i, hi_i].
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>* out);

}  // namespace afd::serve
