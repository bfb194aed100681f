#include "runtime/topology_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace afd {
namespace {

using json = nlohmann::json;

// Reads fields of one JSON object, each error naming origin + path of the field.
class Fields {
 public:
  Fields(const json& obj, std::string origin, std::string path) : obj_(obj), origin_(std::move(origin)), path_(std::move(path)) {}

  Status check_keys(std::initializer_list<const char*> allowed) const {
    std::set<std::string> ok(allowed.begin(), allowed.end());
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!ok.count(it.key())) return err(it.key(), "unknown field");
    return Status();
  }
  Status str(const char* key, std::string* out, bool required = false) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return required ? err(key, "missing (a string)") : Status();
    if (!it->is_string()) return err(key, "must be a string");
    *out = it->get<std::string>();
    return Status();
  }
  Status integer(const char* key, int* out, int lo, int hi) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return Status();
    if (!it->is_number_integer()) return err(key, "must be an integer");
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) return err(key, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    *out = static_cast<int>(v);
    return Status();
  }
  // A checked integer or string value given under `key`, recorded as the setting `flag_key`.
  Status int_setting(const char* key, const char* flag_key, int lo, int hi, std::vector<TopologySetting>* out) const {
    if (obj_.find(key) == obj_.end()) return Status();
    int v = 0;
    AFD_RETURN_IF_ERROR(integer(key, &v, lo, hi));
    out->push_back({flag_key, v, where(key)});
    return Status();
  }
  Status bool_setting(const char* key, const char* flag_key, std::vector<TopologySetting>* out) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return Status();
    if (!it->is_boolean()) return err(key, "must be true or false");
    out->push_back({flag_key, it->get<bool>(), where(key)});
    return Status();
  }
  Status str_setting(const char* key, const char* flag_key, std::vector<TopologySetting>* out,
                     std::initializer_list<const char*> allowed = {}, const char* allowed_text = "") const {
    if (obj_.find(key) == obj_.end()) return Status();
    std::string v;
    AFD_RETURN_IF_ERROR(str(key, &v));
    if (allowed.size() > 0 && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) return err(key, allowed_text);
    out->push_back({flag_key, v, where(key)});
    return Status();
  }
  std::string where(const std::string& key) const { return path_ + (path_.empty() ? "" : ".") + key; }
  Status err(const std::string& key, const std::string& what) const {
    return invalid_argument(origin_ + ": " + path_ + (path_.empty() ? "" : ".") + key + ": " + what);
  }

 private:
  const json& obj_;
  std::string origin_;
  std::string path_;
};

Status parse_worker(const json& j, const std::string& origin, const std::string& path, bool attention,
                    const std::string& model_dir, TopologyWorker* w) {
  if (!j.is_object()) return invalid_argument(origin + ": " + path + ": must be an object");
  Fields f(j, origin, path);
  if (attention) AFD_RETURN_IF_ERROR(f.check_keys({"address", "listen", "model", "threads", "microbatches"}));
  else AFD_RETURN_IF_ERROR(f.check_keys({"address", "listen", "model", "threads", "device", "metrics"}));
  w->model_dir = model_dir;
  AFD_RETURN_IF_ERROR(f.str("address", &w->address, /*required=*/true));
  std::string h;
  int p = 0;
  if (Status s = split_host_port(w->address, &h, &p); !s.is_ok()) return f.err("address", s.message());
  w->listen = w->address;
  AFD_RETURN_IF_ERROR(f.str("listen", &w->listen));
  if (Status s = split_host_port(w->listen, &h, &p); !s.is_ok()) return f.err("listen", s.message());
  AFD_RETURN_IF_ERROR(f.str("model", &w->model_dir));
  AFD_RETURN_IF_ERROR(f.int_setting("threads", "threads", 0, 4096, &w->settings));
  if (attention) AFD_RETURN_IF_ERROR(f.int_setting("microbatches", "microbatches", 1, 4, &w->settings));
  if (!attention) {
    AFD_RETURN_IF_ERROR(f.str_setting("device", "ffn_device", &w->settings, {"cpu", "cuda"}, "must be 'cpu' or 'cuda'"));
    AFD_RETURN_IF_ERROR(f.str("metrics", &w->metrics_listen));
    if (!w->metrics_listen.empty()) {
      if (Status s = split_host_port(w->metrics_listen, &h, &p); !s.is_ok()) return f.err("metrics", s.message());
      w->settings.push_back({"metrics_listen", w->metrics_listen, f.where("metrics")});
    }
  }
  if (w->model_dir.empty()) return f.err("model", "missing (set it here or at the top level)");
  return Status();
}

}  // namespace

Status split_host_port(const std::string& s, std::string* host, int* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    return invalid_argument("'" + s + "' is not host:port");
  std::string h = s.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return invalid_argument("'" + s + "' is not host:port");
    h = h.substr(1, h.size() - 2);
  }
  const std::string ps = s.substr(colon + 1);
  if (ps.size() > 5 || ps.find_first_not_of("0123456789") != std::string::npos)
    return invalid_argument("'" + s + "': port '" + ps + "' is not a number");
  const int p = std::stoi(ps);
  if (p < 1 || p > 65535) return invalid_argument("'" + s + "': port must be in [1, 65535]");
  *host = h;
  *port = p;
  return Status();
}

std::string TopologyFile::topology() const {
  return std::to_string(attention.size()) + "A" + std::to_string(ffn.size()) + "F";
}

std::string TopologyFile::ffn_addresses() const {
  std::string out;
  for (const auto& w : ffn) out += (out.empty() ? "" : ",") + w.address;
  return out;
}

const TopologySetting* TopologyFile::find(const std::string& key) const {
  const TopologySetting* found = nullptr;
  for (const auto& st : settings)
    if (st.key == key) found = &st;
  return found;
}

std::vector<TopologySetting> TopologyFile::worker_settings(bool is_attention, size_t index) const {
  const std::vector<TopologyWorker>& ws = is_attention ? attention : ffn;
  const TopologyWorker& w = ws.at(index);
  const std::string self = std::string(is_attention ? "attention" : "ffn") + "[" + std::to_string(index) + "]";
  std::vector<TopologySetting> out = settings;
  out.insert(out.end(), w.settings.begin(), w.settings.end());
  out.push_back({"model", w.model_dir, self + ".model (or the top level's)"});
  out.push_back({"topology", topology(), "attention, ffn (the worker counts)"});
  out.push_back({"listen", w.listen, self + ".listen (or .address)"});
  out.push_back({"attention", static_cast<int>(attention.size()), "attention (the worker count)"});
  if (!frontend.model_name.empty()) out.push_back({"model_name", frontend.model_name, "frontend.model_name"});
  if (is_attention) {
    out.push_back({"ffn", ffn_addresses(), "ffn[*].address"});
    out.push_back({"attention_index", static_cast<int>(index), self + " (its place in the list)"});
  } else {
    out.push_back({"shard", std::to_string(index) + "/" + std::to_string(ffn.size()), self + " (its place in the list)"});
  }
  return out;
}

std::vector<TopologySetting> TopologyFile::frontend_settings() const {
  std::vector<TopologySetting> out;
  if (!frontend.listen.empty()) {
    std::string host;
    int port = 0;
    if (split_host_port(frontend.listen, &host, &port).is_ok()) {  // checked by the parser
      out.push_back({"host", host, "frontend.listen"});
      out.push_back({"port", port, "frontend.listen"});
    }
  }
  if (!frontend.api_key.empty()) out.push_back({"api_key", frontend.api_key, "frontend.api_key"});
  if (!frontend.model_name.empty()) out.push_back({"model_name", frontend.model_name, "frontend.model_name"});
  out.push_back({"model", frontend.model_dir, "frontend.model (or the top level's)"});
  return out;
}

Result<TopologyFile> parse_topology_file(const std::string& text, const std::string& origin) {
  // Keys seen in each open object, innermost last: a key given twice is an error (the JSON
  // library would keep the last one silently).
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) keys.emplace_back();
    if (ev == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (ev == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line L, column C: ..."
    if (const size_t at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    return invalid_argument(origin + ": not valid JSON: " + what);
  }
  if (!duplicate.empty()) return invalid_argument(origin + ": key \"" + duplicate + "\" appears twice in one object");
  if (!j.is_object()) return invalid_argument(origin + ": must be a JSON object");
  Fields top(j, origin, "");
  AFD_RETURN_IF_ERROR(top.check_keys({"model", "precision", "deterministic", "speculative", "draft_tokens", "ngram_min", "ngram_max", "kv_dtype", "microbatches", "threads", "ffn_timeout_ms",
                                      "ffn_connect_timeout_ms", "ffn_probe_ms", "ffn_takeover_s", "ffn_parts", "peer_timeout_ms", "ffn_tp", "ucx_spin_us", "scheduler",
                                      "frontend", "attention", "ffn"}));
  TopologyFile t;
  std::string model_dir;
  AFD_RETURN_IF_ERROR(top.str("model", &model_dir));
  std::vector<TopologySetting>& st = t.settings;
  AFD_RETURN_IF_ERROR(top.str_setting("precision", "precision", &st, {"fast", "reference"}, "must be 'fast' or 'reference'"));
  AFD_RETURN_IF_ERROR(top.bool_setting("deterministic", "deterministic", &st));
  AFD_RETURN_IF_ERROR(top.str_setting("speculative", "speculative", &st, {"none", "ngram", "mtp"},
                                      "must be 'none', 'ngram' or 'mtp'"));
  AFD_RETURN_IF_ERROR(top.int_setting("draft_tokens", "draft_tokens", 1, 8, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ngram_min", "ngram_min", 1, 16, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ngram_max", "ngram_max", 1, 16, &st));
  AFD_RETURN_IF_ERROR(top.str_setting("kv_dtype", "kv_dtype", &st, {"bf16", "fp8", "f32"}, "must be bf16, fp8 or f32"));
  AFD_RETURN_IF_ERROR(top.int_setting("microbatches", "microbatches", 1, 4, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("threads", "threads", 0, 4096, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ffn_timeout_ms", "ffn_timeout_ms", 1, 86400000, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ffn_connect_timeout_ms", "ffn_connect_timeout_ms", 1, 86400000, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ffn_probe_ms", "ffn_probe_ms", 0, 86400000, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ffn_takeover_s", "ffn_takeover_s", 0, 86400, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ffn_parts", "ffn_parts", 0, 64, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("peer_timeout_ms", "peer_timeout_ms", 1, 86400000, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ffn_tp", "ffn_tp", 1, 64, &st));
  AFD_RETURN_IF_ERROR(top.int_setting("ucx_spin_us", "ucx_spin_us", 0, 1000000, &st));
  if (auto it = j.find("scheduler"); it != j.end()) {
    if (!it->is_object()) return top.err("scheduler", "must be an object");
    Fields s(*it, origin, "scheduler");
    AFD_RETURN_IF_ERROR(s.check_keys(
        {"max_running", "max_queue", "max_batch_tokens", "max_context", "max_seqs", "kv_capacity", "kv_block",
         "step_retry_s", "drain_timeout_s"}));
    AFD_RETURN_IF_ERROR(s.int_setting("max_running", "max_running", 1, 1 << 20, &st));
    AFD_RETURN_IF_ERROR(s.int_setting("max_queue", "max_queue", 0, 1 << 24, &st));
    AFD_RETURN_IF_ERROR(s.int_setting("max_batch_tokens", "max_batch_tokens", 1, 1 << 24, &st));
    AFD_RETURN_IF_ERROR(s.int_setting("max_context", "max_context", 0, 1 << 30, &st));
    AFD_RETURN_IF_ERROR(s.int_setting("max_seqs", "max_seqs", 1, 1 << 20, &st));
    AFD_RETURN_IF_ERROR(s.int_setting("kv_capacity", "kv_capacity", 0, 1 << 30, &st));
    AFD_RETURN_IF_ERROR(s.int_setting("kv_block", "kv_block", 1, 1 << 16, &st));
    AFD_RETURN_IF_ERROR(s.int_setting("step_retry_s", "step_retry_s", 0, 86400, &st));
    AFD_RETURN_IF_ERROR(s.int_setting("drain_timeout_s", "drain_timeout_s", 0, 86400, &st));
  }

  t.frontend.model_dir = model_dir;
  if (auto it = j.find("frontend"); it != j.end()) {
    if (!it->is_object()) return top.err("frontend", "must be an object");
    Fields f(*it, origin, "frontend");
    AFD_RETURN_IF_ERROR(f.check_keys({"listen", "api_key", "model_name", "model"}));
    AFD_RETURN_IF_ERROR(f.str("listen", &t.frontend.listen));
    std::string h;
    int p = 0;
    if (it->contains("listen")) {
      if (Status s = split_host_port(t.frontend.listen, &h, &p); !s.is_ok()) return f.err("listen", s.message());
    }
    AFD_RETURN_IF_ERROR(f.str("api_key", &t.frontend.api_key));
    AFD_RETURN_IF_ERROR(f.str("model_name", &t.frontend.model_name));
    AFD_RETURN_IF_ERROR(f.str("model", &t.frontend.model_dir));
  }
  if (t.frontend.model_dir.empty()) return top.err("model", "missing (the front end needs the tokenizer)");

  for (const char* role : {"attention", "ffn"}) {
    const bool attention = std::string(role) == "attention";
    auto it = j.find(role);
    if (it == j.end()) return top.err(role, "missing (an array of workers)");
    if (!it->is_array() || it->empty() || it->size() > 64) return top.err(role, "must be an array of 1 to 64 workers");
    auto& out = attention ? t.attention : t.ffn;
    for (size_t i = 0; i < it->size(); ++i) {
      TopologyWorker w;
      AFD_RETURN_IF_ERROR(
          parse_worker((*it)[i], origin, std::string(role) + "[" + std::to_string(i) + "]", attention, model_dir, &w));
      out.push_back(std::move(w));
    }
  }
  if (const TopologySetting* tp = t.find("ffn_tp"); tp != nullptr && t.ffn.size() % tp->value.get<size_t>() != 0)
    return top.err("ffn_tp", tp->value.dump() + " does not divide the " + std::to_string(t.ffn.size()) +
                                 " FFN workers");
  // Two workers (or a worker and the front end) on the same address cannot both bind it.
  std::set<std::string> seen;
  if (!t.frontend.listen.empty()) seen.insert(t.frontend.listen);
  for (const char* role : {"attention", "ffn"}) {
    const auto& ws = std::string(role) == "attention" ? t.attention : t.ffn;
    for (size_t i = 0; i < ws.size(); ++i)
      if (!seen.insert(ws[i].address).second)
        return top.err(std::string(role) + "[" + std::to_string(i) + "].address",
                       "'" + ws[i].address + "' is used twice in the file");
  }
  return t;
}

Result<TopologyFile> load_topology_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("topology file '" + path + "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  AFD_ASSIGN_OR_RETURN(TopologyFile t, parse_topology_file(ss.str(), path));
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  auto resolve = [&](std::string* dir) {
    if (!dir->empty() && std::filesystem::path(*dir).is_relative()) *dir = (base / *dir).lexically_normal().string();
  };
  resolve(&t.frontend.model_dir);
  for (auto& w : t.attention) resolve(&w.model_dir);
  for (auto& w : t.ffn) resolve(&w.model_dir);
  return t;
}

}  // namespace afd
