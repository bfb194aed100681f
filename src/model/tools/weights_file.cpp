#include "model/tools/weights_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace afd {

Result<WeightsFile> WeightsFile::open(const std::string& path) {
  AFD_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
  WeightsFile w(std::move(f));
  const auto& ts = w.file_.header().tensors;
  for (size_t i = 0; i < ts.size(); ++i) {
    const DType dt = ts[i].dtype;
    if (dt != DType::f32 && dt != DType::bf16 && dt != DType::f16)
      return invalid_argument(path + ": tensor '" + ts[i].name + "' has dtype " + dtype_name(dt) +
                              " (weights are read from F32, BF16 or F16 tensors)");
    w.index_[ts[i].name] = i;
  }
  w.claimed_.assign(ts.size(), false);
  return w;
}

Status WeightsFile::claim(const std::string& name, const std::vector<int64_t>& shape) {
  auto it = index_.find(name);
  if (it == index_.end())
    return invalid_argument(path() + ": no tensor '" + name + "' (the model needs one of shape " + shape_text(shape) +
                            ")");
  const SafetensorsTensor& t = file_.header().tensors[it->second];
  if (t.shape != shape)
    return invalid_argument(path() + ": tensor '" + name + "' has shape " + shape_text(t.shape) + ", the model needs " +
                            shape_text(shape));
  constexpr size_t kChunk = 1 << 16;
  std::vector<float> buf(kChunk);
  const size_t numel = static_cast<size_t>(t.numel());
  for (size_t at = 0; at < numel; at += kChunk) {
    const size_t n = std::min(kChunk, numel - at);
    tensor_to_f32(t.dtype, file_.tensor_data(it->second) + at * dtype_size(t.dtype), n, buf.data());
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(buf[i]))
        return invalid_argument(path() + ": tensor '" + name + "' holds a non-finite value at element " +
                                std::to_string(at + i));
    }
  }
  claimed_[it->second] = true;
  return Status();
}

Status WeightsFile::check_all_claimed() const {
  const auto& ts = file_.header().tensors;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!claimed_[i])
      return invalid_argument(path() + ": tensor '" + ts[i].name + "' " + shape_text(ts[i].shape) +
                              " is not a tensor of this model");
  }
  return Status();
}

void WeightsFile::read(const std::string& name, int64_t offset, float* out, size_t n) const {
  auto it = index_.find(name);
  AFD_CHECK(it != index_.end() && claimed_[it->second]);
  const SafetensorsTensor& t = file_.header().tensors[it->second];
  AFD_CHECK(offset >= 0 && static_cast<uint64_t>(offset) + n <= static_cast<uint64_t>(t.numel()));
  tensor_to_f32(t.dtype, file_.tensor_data(it->second) + static_cast<size_t>(offset) * dtype_size(t.dtype), n, out);
}

}  // namespace afd
