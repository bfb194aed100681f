// Loader for the golden cases written by tests/reference/make_golden.py.
#pragma once

#include <string>
#include <vector>

namespace afd::testing {

struct GoldenCase {
  std::string name;
  std::string dir;
  std::vector<std::vector<int32_t>> prompts;
  // The oracle's model family for the DeepSeek / Step-3 cases ("deepseek", "step3"); empty
  // for the Qwen / Mixtral cases.
  std::string family;
  std::vector<std::vector<int32_t>> greedy;  // max_new_tokens per prompt (32 or 8)
  int64_t vocab = 0;
  // Per prompt: rows [prompt_len + n_gen - 1, vocab].
  std::vector<std::vector<float>> logits;
};

// Every case directory under tests/reference/data that has a golden.json.
std::vector<std::string> golden_case_dirs();
GoldenCase load_golden(const std::string& dir);

}  // namespace afd::testing
