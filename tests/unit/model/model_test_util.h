// Helpers for model tests: temp directories and hand-built safetensors files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <unistd.h>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace afd::test {

// A fresh directory <system temp dir>/<name>_<pid>, removed with its contents when the
// object dies; by default named after the running test.
class TempDir {
 public:
  TempDir() : TempDir(test_name()) {}
  explicit TempDir(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))).string()) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;  // (a destructor, also at exit: never throws)
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  static std::string test_name() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("afd_model_") + (info ? info->test_suite_name() : "x") + "_" + (info ? info->name() : "y");
    for (char& ch : name) {
      if (ch == '/') ch = '_';
    }
    return name;
  }

  std::string path_;
};

// A TempDir for files that serve every test of one process (a checkpoint cached across
// tests): it lives, and is removed, with the process.
inline std::string process_scratch_dir(const std::string& name) {
  static std::vector<std::unique_ptr<TempDir>> dirs;
  dirs.push_back(std::make_unique<TempDir>(name));
  return dirs.back()->path();
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// [u64 len][header][data]: a safetensors file from raw header text (may be any bytes).
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Splits a safetensors file into its header JSON and data section (no validation).
inline void split_safetensors(const std::string& bytes, nlohmann::ordered_json* header, std::string* data) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  *header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  *data = bytes.substr(8 + n);
}

// Rewrites the header of the safetensors file at `path` with `edit` (data bytes unchanged).
template <class F>
void edit_safetensors_header(const std::string& path, F edit) {
  nlohmann::ordered_json h;
  std::string data;
  split_safetensors(read_bytes(path), &h, &data);
  edit(h);
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section aligned
  write_bytes(path, safetensors_bytes(text, data));
}

}  // namespace afd::test
