// Safetensors: the file format of Hugging Face checkpoints.
//
//   [u64 little-endian N][N bytes of JSON header][data section]
//   header: {"__metadata__": {str: str}, "<tensor name>": {"dtype": "BF16",
//            "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
//   offsets are relative to the start of the data section.
//
// parse_safetensors() works on a byte span (no I/O), so the fuzzer drives it directly.
// It checks everything a lying header can get wrong: header length beyond the file,
// non-JSON or non-object header, unknown dtype, negative/overflowing shapes, offsets
// past the data, begin > end, byte counts that disagree with dtype x shape, and
// overlapping tensors. Errors are corrupt_data / not_supported naming `source` and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace afd {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // may be empty (a scalar)
  uint64_t begin = 0;          // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_len = 0;    // N
  uint64_t data_offset = 0;   // 8 + N: where the data section starts in the file
  uint64_t data_size = 0;     // bytes after data_offset
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
  std::vector<SafetensorsTensor> tensors;       // in header order
};

// Upper bound on N, as in the reference implementation (100 MB).
constexpr uint64_t kSafetensorsMaxHeaderLen = 100u * 1000u * 1000u;

// Parses and validates the header of a whole safetensors file held in `bytes`.
// `source` (usually the path) prefixes every error message.
Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> bytes, const std::string& source);

// A memory-mapped safetensors file with its validated header. Move-only.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors name the path (and tensor where relevant).
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  // Start of tensor i's bytes (i indexes header().tensors). Valid while this object lives.
  const uint8_t* tensor_data(size_t i) const {
    return file_.data() + header_.data_offset + header_.tensors[i].begin;
  }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// Widens n elements of a tensor stored as f32, bf16 or f16 at src (any alignment) to float
// (exact); other dtypes write nothing. f16 goes through F16C where the CPU has it.
void tensor_to_f32(DType dt, const uint8_t* src, size_t n, float* dst);

// A shape as "[a, b, c]" for messages.
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace afd
