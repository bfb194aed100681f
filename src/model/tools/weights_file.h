// WeightsFile: one safetensors file whose tensors supply the values of a checkpoint that
// make_model writes (MakeModelOptions::weights_path), instead of its random generator.
// Tensors are F32, BF16 or F16 and are read as f32. The caller claims every tensor it needs
// with its exact shape; a tensor left unclaimed is an error too (check_all_claimed), so a file
// and a model either match name for name or fail naming the first difference.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/safetensors.h"

namespace afd {

class WeightsFile {
 public:
  // Maps and validates `path` (model/safetensors.h); refuses tensors of other dtypes.
  static Result<WeightsFile> open(const std::string& path);

  // Checks that tensor `name` exists with exactly `shape` and holds only finite values, and
  // marks it used. Errors (invalid_argument) name the file, the tensor and both shapes.
  Status claim(const std::string& name, const std::vector<int64_t>& shape);
  // Error naming the first tensor (in header order) that no claim used.
  Status check_all_claimed() const;
  // Values [offset, offset + n) of the claimed tensor `name`, as f32.
  void read(const std::string& name, int64_t offset, float* out, size_t n) const;

  const std::string& path() const { return file_.path(); }

 private:
  explicit WeightsFile(SafetensorsFile f) : file_(std::move(f)) {}
  SafetensorsFile file_;
  std::map<std::string, size_t> index_;  // name -> header().tensors index
  std::vector<bool> claimed_;            // per header().tensors index
};

}  // namespace afd
