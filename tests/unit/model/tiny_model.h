// Test helper: a qwen2_moe "tiny" checkpoint (8 experts, top-2, shared expert) written by
// make_model into a process scratch directory and loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model_test_util.h"
#include "model/tools/make_model.h"
#include "model/weights.h"

namespace afd::test {

// `dir_name` names the directory (one per process, removed at exit); null on failure (the
// test is failed with the reason).
inline std::shared_ptr<const ModelWeights> make_tiny_moe(const std::string& dir_name, int64_t n_layers, uint64_t seed,
                                                         std::vector<int64_t> mlp_only_layers = {},
                                                         DType dtype = DType::bf16) {
  auto c = make_preset_config(Arch::qwen2_moe, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return nullptr;
  c->n_layers = n_layers;
  c->mlp_only_layers = std::move(mlp_only_layers);
  MakeModelOptions o;
  o.out_dir = process_scratch_dir(dir_name);
  o.seed = seed;
  o.dtype = dtype;
  auto r = make_model(*c, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  auto w = load_model(o.out_dir);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? *w : nullptr;
}

}  // namespace afd::test
