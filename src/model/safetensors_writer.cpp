#include "model/safetensors_writer.h"

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/checkpoint.h"

namespace afd {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

uint64_t TensorSpec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

class OutFile {
 public:
  ~OutFile() {
    if (f_) std::fclose(f_);
  }
  Status open(const std::string& path) {
    path_ = path;
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) return io_error(path + ": cannot open for writing");
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 22);
    return Status();
  }
  Status write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) return io_error(path_ + ": write failed (disk full?)");
    return Status();
  }
  Status close() {
    int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) return io_error(path_ + ": close failed (disk full?)");
    return Status();
  }

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

// One safetensors file holding tensors[first, last) of the list.
Status write_shard(const std::string& path, const std::vector<TensorSpec>& tensors, size_t first, size_t last,
                   const TensorDataFn& data) {
  ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (size_t i = first; i < last; ++i) {
    const TensorSpec& t = tensors[i];
    const uint64_t nb = t.nbytes();
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + nb}}};
    offset += nb;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section 8-byte aligned, as HF writes it
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  OutFile f;
  AFD_RETURN_IF_ERROR(f.open(tmp));
  AFD_RETURN_IF_ERROR(f.write(len, 8));
  AFD_RETURN_IF_ERROR(f.write(text.data(), text.size()));
  for (size_t i = first; i < last; ++i) {
    uint64_t written = 0;
    const ByteWriter w = [&](const void* p, size_t n) {
      written += n;
      return f.write(p, n);
    };
    AFD_RETURN_IF_ERROR(data(i, w));
    if (written != tensors[i].nbytes()) {
      return internal_error(path + ": tensor '" + tensors[i].name + "' produced " + std::to_string(written) +
                            " bytes, expected " + std::to_string(tensors[i].nbytes()));
    }
  }
  AFD_RETURN_IF_ERROR(f.close());
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return io_error(path + ": rename from " + tmp + " failed: " + ec.message());
  return Status();
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

Status write_text_file(const std::string& path, const std::string& text) {
  OutFile f;
  AFD_RETURN_IF_ERROR(f.open(path));
  AFD_RETURN_IF_ERROR(f.write(text.data(), text.size()));
  return f.close();
}

Status remove_checkpoint_tensors(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string n = entry.path().filename().string();
    if (n == kSafetensorsSingleName || n == kSafetensorsIndexName ||
        (n.rfind("model-", 0) == 0 && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors")) {
      fs::remove(entry.path(), ec);
      if (ec) return io_error(entry.path().string() + ": cannot remove: " + ec.message());
    }
  }
  return Status();
}

Result<WrittenCheckpoint> write_checkpoint_tensors(const std::string& dir, const std::vector<TensorSpec>& tensors,
                                                   uint64_t shard_size, const TensorDataFn& data) {
  if (shard_size == 0) return invalid_argument("shard size must be positive");
  WrittenCheckpoint out;
  // Shard boundaries: [bounds[k], bounds[k + 1]).
  std::vector<size_t> bounds{0};
  uint64_t in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t nb = tensors[i].nbytes();
    if (i > bounds.back() && in_shard + nb > shard_size) {
      bounds.push_back(i);
      in_shard = 0;
    }
    in_shard += nb;
    out.tensor_bytes += nb;
  }
  bounds.push_back(tensors.size());
  const size_t n_shards = bounds.size() - 1;
  if (n_shards == 1) {
    const std::string path = dir + "/" + kSafetensorsSingleName;
    AFD_RETURN_IF_ERROR(write_shard(path, tensors, 0, tensors.size(), data));
    out.files.push_back(path);
    return out;
  }
  json weight_map = json::object();
  for (size_t k = 0; k < n_shards; ++k) {
    const std::string name = shard_name(k, n_shards);
    const std::string path = dir + "/" + name;
    AFD_RETURN_IF_ERROR(write_shard(path, tensors, bounds[k], bounds[k + 1], data));
    out.files.push_back(path);
    for (size_t i = bounds[k]; i < bounds[k + 1]; ++i) weight_map[tensors[i].name] = name;
  }
  json index = {{"metadata", {{"total_size", out.tensor_bytes}}}, {"weight_map", weight_map}};
  const std::string index_path = dir + "/" + kSafetensorsIndexName;
  AFD_RETURN_IF_ERROR(write_text_file(index_path, index.dump(2) + "\n"));
  out.files.push_back(index_path);
  return out;
}

}  // namespace afd
