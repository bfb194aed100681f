#include "model/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace afd {

using json = nlohmann::json;

namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return file_exists(path) ? io_error(path + ": cannot open for reading") : not_found(path + ": no such file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path + ": read failed");
  return ss.str();
}

// A shard name from the index must be a plain file name inside the model directory.
bool safe_shard_name(const std::string& s) {
  return !s.empty() && s.find('/') == std::string::npos && s.find('\\') == std::string::npos && s != "." &&
         s != "..";
}

}  // namespace

Result<std::shared_ptr<Checkpoint>> Checkpoint::open(const std::string& model_dir) {
  auto ck = std::make_shared<Checkpoint>();
  ck->dir_ = model_dir;
  const std::string single = model_dir + "/" + kSafetensorsSingleName;
  const std::string index = model_dir + "/" + kSafetensorsIndexName;

  // (shard file name, tensors the index assigns to it)
  std::vector<std::pair<std::string, std::vector<std::string>>> shards;
  if (file_exists(single)) {
    shards.push_back({kSafetensorsSingleName, {}});
  } else if (file_exists(index)) {
    ck->sharded_ = true;
    AFD_ASSIGN_OR_RETURN(std::string text, read_text_file(index));
    json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded()) return corrupt_data(index + ": not valid JSON");
    if (!root.is_object()) return corrupt_data(index + ": not a JSON object");
    auto wm = root.find("weight_map");
    if (wm == root.end() || !wm->is_object()) return corrupt_data(index + ": missing or non-object 'weight_map'");
    if (wm->empty()) return corrupt_data(index + ": 'weight_map' is empty");
    std::map<std::string, size_t> shard_pos;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) return corrupt_data(index + ": weight_map['" + it.key() + "'] is not a string");
      const auto& shard = it->get_ref<const std::string&>();
      if (!safe_shard_name(shard)) {
        return corrupt_data(index + ": weight_map['" + it.key() + "'] = '" + shard +
                            "' is not a file name inside the model directory");
      }
      auto [pos, inserted] = shard_pos.emplace(shard, shards.size());
      if (inserted) shards.push_back({shard, {}});
      shards[pos->second].second.push_back(it.key());
    }
  } else {
    return not_found(model_dir + ": no " + kSafetensorsSingleName + " or " + kSafetensorsIndexName);
  }

  for (auto& [shard, expected] : shards) {
    const std::string path = model_dir + "/" + shard;
    if (ck->sharded_ && !file_exists(path)) {
      return not_found(index + " names shard '" + shard + "' (for tensor '" + expected.front() +
                       "'), but " + path + " does not exist");
    }
    AFD_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
    auto owned = std::make_unique<SafetensorsFile>(std::move(f));
    const SafetensorsFile* sf = owned.get();
    ck->files_.push_back(std::move(owned));
    const std::string* file_path = &sf->path();
    for (size_t i = 0; i < sf->header().tensors.size(); ++i) {
      const auto& t = sf->header().tensors[i];
      TensorRef ref{&t, sf->tensor_data(i), file_path};
      auto [it, inserted] = ck->by_name_.emplace(t.name, ref);
      if (!inserted) {
        return corrupt_data(model_dir + ": tensor '" + t.name + "' is stored twice, in " + *it->second.file +
                            " and " + path);
      }
    }
    for (const auto& name : expected) {
      auto it = ck->by_name_.find(name);
      if (it == ck->by_name_.end() || it->second.file != file_path) {
        return corrupt_data(index + " puts tensor '" + name + "' in " + shard + ", but " + path +
                            " does not contain it");
      }
    }
  }
  return ck;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

const TensorRef* Checkpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

Result<TensorRef> Checkpoint::get(const std::string& name) const {
  const TensorRef* r = find(name);
  if (!r) return not_found(dir_ + ": checkpoint has no tensor '" + name + "'");
  return *r;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [k, v] : by_name_) out.push_back(k);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Checkpoint::file_of(const std::string& name) const {
  const TensorRef* r = find(name);
  return r ? *r->file : std::string();
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [k, v] : by_name_) n += v.info->nbytes();
  return n;
}

}  // namespace afd
