// Test helper: rewrites a checkpoint directory tensor by tensor, to build bad inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/safetensors_writer.h"

namespace afd::test {

// Changes one tensor's spec and bytes in place; returning false drops the tensor.
using TensorEdit = std::function<bool(TensorSpec&, std::vector<uint8_t>&)>;

// Rewrites DIR's checkpoint through `edit`, then appends `extra` tensors (zero bytes).
inline void rewrite_checkpoint(const std::string& dir, const TensorEdit& edit,
                               const std::vector<TensorSpec>& extra = {}) {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<uint8_t>> bytes;
  {
    auto ck = Checkpoint::open(dir);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    for (const std::string& n : (*ck)->tensor_names()) {
      const TensorRef* t = (*ck)->find(n);
      TensorSpec s{n, t->info->dtype, t->info->shape};
      std::vector<uint8_t> b(t->data, t->data + t->info->nbytes());
      if (!edit(s, b)) continue;
      specs.push_back(s);
      bytes.push_back(std::move(b));
    }
  }
  for (const TensorSpec& s : extra) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    specs.push_back(s);
    bytes.emplace_back(static_cast<size_t>(n) * dtype_size(s.dtype), 0);
  }
  ASSERT_TRUE(remove_checkpoint_tensors(dir).is_ok());
  auto r = write_checkpoint_tensors(dir, specs, uint64_t{1} << 40,
                                    [&](size_t i, const ByteWriter& w) { return w(bytes[i].data(), bytes[i].size()); });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

}  // namespace afd::test
