// Writing Hugging Face checkpoints: a list of tensors into DIR/model.safetensors, or into
// shards model-0000i-of-0000n.safetensors plus model.safetensors.index.json when they exceed
// the shard size. Tensor data is streamed by a callback, so memory use does not grow with the
// model. Each file is written to FILE.tmp and renamed into place. Used by make_model and by
// checkpoint conversion (model/quantize.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace afd {

struct TensorSpec {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

// Hands the bytes of a tensor to the file, in order, possibly in several calls.
using ByteWriter = std::function<Status(const void* data, size_t n)>;
// Produces tensor `index` (into the list given to write_checkpoint_tensors) through `write`;
// it must write exactly that tensor's nbytes(). Called once per tensor, in list order.
using TensorDataFn = std::function<Status(size_t index, const ByteWriter& write)>;

struct WrittenCheckpoint {
  std::vector<std::string> files;  // safetensors files, then the index when sharded
  uint64_t tensor_bytes = 0;
};

// Greedy sharding in list order: a new shard starts when the next tensor would overflow
// shard_size bytes (a tensor larger than shard_size gets a shard of its own).
Result<WrittenCheckpoint> write_checkpoint_tensors(const std::string& dir, const std::vector<TensorSpec>& tensors,
                                                   uint64_t shard_size, const TensorDataFn& data);

// Removes DIR's model.safetensors, index and model-*.safetensors, so the directory ends up
// holding exactly one checkpoint.
Status remove_checkpoint_tensors(const std::string& dir);

// Writes a text file (config.json and friends). Errors name the path.
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace afd
