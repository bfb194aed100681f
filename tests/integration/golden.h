// Loader for the golden cases written by tests/reference/make_golden.py.
#pragma once

#include <string>
#include <vector>

namespace afd::testing {

struct GoldenCase {
  std::string name;
  std::string dir;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> greedy;  // 32 tokens per prompt
  int64_t vocab = 0;
  // Per prompt: rows [prompt_len + n_gen - 1, vocab].
  std::vector<std::vector<float>> logits;
};

// Every case directory under tests/reference/data that has a golden.json.
std::vector<std::string> golden_case_dirs();
GoldenCase load_golden(const std::string& dir);

}  // namespace afd::testing
