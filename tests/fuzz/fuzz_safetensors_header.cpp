// libFuzzer target: parse_safetensors() on arbitrary bytes (a whole file: u64 length,
// JSON header, data). Any input must give a header or an error Status, never a crash,
// a sanitizer report or an unbounded allocation. On success, every tensor must lie
// inside the data section with a byte count equal to dtype x shape (the parser's contract).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = afd::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  if (!r.ok()) {
    if (r.status().message().empty()) std::abort();
    return 0;
  }
  const auto& h = *r;
  if (h.data_offset + h.data_size != size) std::abort();
  for (const auto& t : h.tensors) {
    if (t.begin > t.end || t.end > h.data_size) std::abort();
    if (static_cast<uint64_t>(t.numel()) * afd::dtype_size(t.dtype) != t.nbytes()) std::abort();
  }
  return 0;
}
