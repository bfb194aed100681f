// Helpers for model tests: temp directories and hand-built safetensors files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace afd::test {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("afd_model_") + (info ? info->test_suite_name() : "x") + "_" +
                       (info ? info->name() : "y") + "_" + std::to_string(::getpid());
    for (char& ch : name) {
      if (ch == '/') ch = '_';
    }
    path_ = (std::filesystem::temp_directory_path() / name).string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// <system temp dir>/<name>_<pid>, created empty, for files that serve every test of one
// process (a checkpoint cached across tests): the process that made it removes it, with its
// contents, at exit.
inline std::string process_scratch_dir(const std::string& name) {
  struct Registry {
    pid_t owner = ::getpid();
    std::vector<std::string> dirs;
    ~Registry() {
      if (::getpid() != owner) return;  // a forked child exiting normally leaves them be
      for (const auto& d : dirs) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    }
  };
  static Registry registry;
  std::string dir = (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  registry.dirs.push_back(dir);
  return dir;
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
