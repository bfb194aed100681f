// hash64: a fast, non-cryptographic 64-bit hash over bytes. Its values are part of the AFD
// wire format (frame header and payload checksums, docs/PROTOCOL.md) and of the model
// fingerprint (model/fingerprint.h): a change to it is a protocol change.
#pragma once

#include <cstddef>
#include <cstdint>

namespace afd {

// Hash of data[0, n) seeded with `seed` (chain calls by passing the previous result).
uint64_t hash64(const void* data, size_t n, uint64_t seed = 0x9e3779b97f4a7c15ull);

}  // namespace afd
