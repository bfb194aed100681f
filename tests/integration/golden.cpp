#include "golden.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace afd::testing {

std::vector<std::string> golden_case_dirs() {
  std::vector<std::string> out;
  std::filesystem::path root = std::filesystem::path(AFD_SOURCE_DIR) / "tests/reference/data";
  if (!std::filesystem::exists(root)) return out;
  for (auto& e : std::filesystem::directory_iterator(root))
    if (e.is_directory() && std::filesystem::exists(e.path() / "golden.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

GoldenCase load_golden(const std::string& dir) {
  GoldenCase g;
  g.dir = dir;
  std::ifstream f(dir + "/golden.json");
  auto j = nlohmann::json::parse(f);
  g.name = j.value("case", std::filesystem::path(dir).filename().string());
  g.family = j.value("family", std::string());
  g.prompts = j.at("prompts").get<std::vector<std::vector<int32_t>>>();
  g.greedy = j.at("greedy_tokens").get<std::vector<std::vector<int32_t>>>();
  g.vocab = j.at("vocab_size").get<int64_t>();
  std::ifstream lf(dir + "/" + j.value("logits_file", std::string("logits.f32")), std::ios::binary);
  lf.seekg(0, std::ios::end);
  size_t bytes = static_cast<size_t>(lf.tellg());
  lf.seekg(0);
  std::vector<float> data(bytes / 4);
  lf.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(bytes));
  size_t off = 0;
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    size_t rows = g.prompts[i].size() + g.greedy[i].size() - 1;
    if ((off + rows) * g.vocab > data.size()) throw std::runtime_error(dir + ": logits file too short");
    g.logits.emplace_back(data.begin() + off * g.vocab, data.begin() + (off + rows) * g.vocab);
    off += rows;
  }
  if (off * g.vocab != data.size()) throw std::runtime_error(dir + ": logits file has extra rows");
  return g;
}

}  // namespace afd::testing
