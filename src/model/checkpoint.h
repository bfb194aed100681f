// Checkpoint: every tensor of a Hugging Face model directory, memory-mapped.
//
// A directory holds either DIR/model.safetensors, or DIR/model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {"<tensor>": "<shard file>"}}) and the shards it names.
// When both exist the single file wins (as in transformers). All files stay mapped for the
// Checkpoint's lifetime; TensorRef pointers are valid as long as the Checkpoint lives.
// Thread-safety: immutable after open(); concurrent reads are fine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "model/safetensors.h"

namespace afd {

constexpr const char* kSafetensorsSingleName = "model.safetensors";
constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

struct TensorRef {
  const SafetensorsTensor* info = nullptr;  // name, dtype, shape, offsets
  const uint8_t* data = nullptr;            // info->nbytes() bytes, mapped
  const std::string* file = nullptr;        // path of the file that holds it
};

class Checkpoint {
 public:
  // Opens and validates every safetensors file of `model_dir`. Errors name the directory,
  // the index, the shard and the tensor: no safetensors at all, an index that is not JSON
  // or lacks "weight_map", a shard that is missing or corrupt, a tensor the index puts in a
  // shard that does not contain it, a tensor found in two files.
  static Result<std::shared_ptr<Checkpoint>> open(const std::string& model_dir);

  const std::string& dir() const { return dir_; }
  // Paths of the mapped files, in index order (one entry for a single-file checkpoint).
  std::vector<std::string> files() const;
  bool sharded() const { return sharded_; }

  size_t n_tensors() const { return by_name_.size(); }
  bool contains(const std::string& name) const { return by_name_.count(name) != 0; }
  // nullptr when absent.
  const TensorRef* find(const std::string& name) const;
  // not_found naming the tensor and the directory when absent.
  Result<TensorRef> get(const std::string& name) const;
  // All tensor names, sorted.
  std::vector<std::string> tensor_names() const;
  // "DIR/model-00002-of-00003.safetensors" for a tensor, or "" when absent.
  std::string file_of(const std::string& name) const;
  // Sum of all tensors' bytes.
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;  // stable addresses for TensorRef
  std::unordered_map<std::string, TensorRef> by_name_;
};

}  // namespace afd
