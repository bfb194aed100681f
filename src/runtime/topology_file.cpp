#include "runtime/topology_file.h"

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
    return Status::ok();
  }
  Status str(const char* key, std::string* out, bool required = false) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return required ? err(key, "missing (a string)") : Status::ok();
    if (!it->is_string()) return err(key, "must be a string");
    *out = it->get<std::string>();
    return Status::ok();
  }
  Status integer(const char* key, int* out, int lo, int hi) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return Status::ok();
    if (!it->is_number_integer()) return err(key, "must be an integer");
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) return err(key, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    *out = static_cast<int>(v);
    return Status::ok();
  }
  Status err(const std::string& key, const std::string& what) const {
    return invalid_argument(origin_ + ": " + path_ + (path_.empty() ? "" : ".") + key + ": " + what);
  }

 private:
  const json& obj_;
  std::string origin_;
  std::string path_;
};

Status parse_worker(const json& j, const std::string& origin, const std::string& path, bool attention,
                    const TopologyWorker& defaults, TopologyWorker* w) {
  if (!j.is_object()) return invalid_argument(origin + ": " + path + ": must be an object");
  Fields f(j, origin, path);
  if (attention) AFD_RETURN_IF_ERROR(f.check_keys({"address", "listen", "model", "threads", "microbatches"}));
  else AFD_RETURN_IF_ERROR(f.check_keys({"address", "listen", "model", "threads", "device", "metrics"}));
  *w = defaults;
  AFD_RETURN_IF_ERROR(f.str("address", &w->address, /*required=*/true));
  std::string h;
  int p = 0;
  if (Status s = split_host_port(w->address, &h, &p); !s.is_ok()) return f.err("address", s.message());
  w->listen = w->address;
  AFD_RETURN_IF_ERROR(f.str("listen", &w->listen));
  if (Status s = split_host_port(w->listen, &h, &p); !s.is_ok()) return f.err("listen", s.message());
  AFD_RETURN_IF_ERROR(f.str("model", &w->model_dir));
  AFD_RETURN_IF_ERROR(f.integer("threads", &w->threads, 0, 4096));
  if (attention) AFD_RETURN_IF_ERROR(f.integer("microbatches", &w->microbatches, 1, 4));
  if (!attention) {
    AFD_RETURN_IF_ERROR(f.str("device", &w->device));
    if (w->device != "cpu" && w->device != "cuda") return f.err("device", "must be 'cpu' or 'cuda'");
    AFD_RETURN_IF_ERROR(f.str("metrics", &w->metrics_listen));
    if (!w->metrics_listen.empty()) {
      if (Status s = split_host_port(w->metrics_listen, &h, &p); !s.is_ok()) return f.err("metrics", s.message());
    }
  }
  if (w->model_dir.empty()) return f.err("model", "missing (set it here or at the top level)");
  return Status::ok();
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
  return Status::ok();
}

std::string TopologyFile::topology() const {
  return std::to_string(attention.size()) + "A" + std::to_string(ffn.size()) + "F";
}

std::string TopologyFile::ffn_addresses() const {
  std::string out;
  for (const auto& w : ffn) out += (out.empty() ? "" : ",") + w.address;
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
  AFD_RETURN_IF_ERROR(top.check_keys({"model", "precision", "kv_dtype", "microbatches", "threads", "ffn_timeout_ms",
                                      "ffn_connect_timeout_ms", "ffn_probe_ms", "ffn_takeover_s", "ffn_parts", "peer_timeout_ms", "ffn_tp", "ucx_spin_us", "scheduler",
                                      "frontend", "attention", "ffn"}));
  TopologyFile t;
  TopologyWorker defaults;
  AFD_RETURN_IF_ERROR(top.str("model", &defaults.model_dir));
  AFD_RETURN_IF_ERROR(top.str("precision", &t.precision));
  if (t.precision != "fast" && t.precision != "reference") return top.err("precision", "must be 'fast' or 'reference'");
  AFD_RETURN_IF_ERROR(top.str("kv_dtype", &t.kv_dtype));
  if (t.kv_dtype != "bf16" && t.kv_dtype != "fp8" && t.kv_dtype != "f32") return top.err("kv_dtype", "must be bf16, fp8 or f32");
  AFD_RETURN_IF_ERROR(top.integer("microbatches", &defaults.microbatches, 1, 4));
  AFD_RETURN_IF_ERROR(top.integer("threads", &defaults.threads, 0, 4096));
  AFD_RETURN_IF_ERROR(top.integer("ffn_timeout_ms", &t.ffn_timeout_ms, 1, 86400000));
  AFD_RETURN_IF_ERROR(top.integer("ffn_connect_timeout_ms", &t.ffn_connect_timeout_ms, 1, 86400000));
  AFD_RETURN_IF_ERROR(top.integer("ffn_probe_ms", &t.ffn_probe_ms, 0, 86400000));
  AFD_RETURN_IF_ERROR(top.integer("ffn_takeover_s", &t.ffn_takeover_s, 0, 86400));
  AFD_RETURN_IF_ERROR(top.integer("ffn_parts", &t.ffn_parts, 0, 64));
  AFD_RETURN_IF_ERROR(top.integer("peer_timeout_ms", &t.peer_timeout_ms, 1, 86400000));
  AFD_RETURN_IF_ERROR(top.integer("ffn_tp", &t.ffn_tp, 1, 64));
  AFD_RETURN_IF_ERROR(top.integer("ucx_spin_us", &t.ucx_spin_us, 0, 1000000));
  if (auto it = j.find("scheduler"); it != j.end()) {
    if (!it->is_object()) return top.err("scheduler", "must be an object");
    Fields s(*it, origin, "scheduler");
    AFD_RETURN_IF_ERROR(s.check_keys(
        {"max_running", "max_queue", "max_batch_tokens", "max_context", "max_seqs", "kv_capacity", "kv_block",
         "step_retry_s", "drain_timeout_s"}));
    TopologyScheduler& d = t.scheduler;
    AFD_RETURN_IF_ERROR(s.integer("max_running", &d.max_running, 1, 1 << 20));
    AFD_RETURN_IF_ERROR(s.integer("max_queue", &d.max_queue, 0, 1 << 24));
    AFD_RETURN_IF_ERROR(s.integer("max_batch_tokens", &d.max_batch_tokens, 1, 1 << 24));
    AFD_RETURN_IF_ERROR(s.integer("max_context", &d.max_context, 0, 1 << 30));
    AFD_RETURN_IF_ERROR(s.integer("max_seqs", &d.max_seqs, 1, 1 << 20));
    AFD_RETURN_IF_ERROR(s.integer("kv_capacity", &d.kv_capacity, 0, 1 << 30));
    AFD_RETURN_IF_ERROR(s.integer("kv_block", &d.kv_block, 1, 1 << 16));
    AFD_RETURN_IF_ERROR(s.integer("step_retry_s", &d.step_retry_s, 0, 86400));
    AFD_RETURN_IF_ERROR(s.integer("drain_timeout_s", &d.drain_timeout_s, 0, 86400));
  }

  t.frontend.model_dir = defaults.model_dir;
  if (auto it = j.find("frontend"); it != j.end()) {
    if (!it->is_object()) return top.err("frontend", "must be an object");
    Fields f(*it, origin, "frontend");
    AFD_RETURN_IF_ERROR(f.check_keys({"listen", "api_key", "model_name", "model"}));
    AFD_RETURN_IF_ERROR(f.str("listen", &t.frontend.listen));
    std::string h;
    int p = 0;
    if (Status s = split_host_port(t.frontend.listen, &h, &p); !s.is_ok()) return f.err("listen", s.message());
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
          parse_worker((*it)[i], origin, std::string(role) + "[" + std::to_string(i) + "]", attention, defaults, &w));
      out.push_back(std::move(w));
    }
  }
  if (t.ffn.size() % static_cast<size_t>(t.ffn_tp) != 0)
    return top.err("ffn_tp", std::to_string(t.ffn_tp) + " does not divide the " + std::to_string(t.ffn.size()) +
                                 " FFN workers");
  // Two workers (or a worker and the front end) on the same address cannot both bind it.
  std::set<std::string> seen{t.frontend.listen};
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
