#include "runtime/trace.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

namespace afd {

void TraceRecorder::span(std::string name, int pid, int tid, int64_t t0_ns, int64_t t1_ns, int64_t layer,
                         int64_t microbatch, int64_t tokens) {
  std::lock_guard<std::mutex> lk(mu_);
  spans_.push_back(Span{std::move(name), pid, tid, t0_ns, t1_ns, layer, microbatch, tokens});
}

void TraceRecorder::name_process(int pid, std::string name) {
  std::lock_guard<std::mutex> lk(mu_);
  names_.emplace_back(pid, std::move(name));
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return spans_.size();
}

Status TraceRecorder::write(const std::string& path) const {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t origin = INT64_MAX;
  for (const Span& s : spans_) origin = std::min(origin, s.t0);
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& [pid, name] : names_)
    ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
  for (const Span& s : spans_) {
    nlohmann::json args = nlohmann::json::object();
    if (s.layer >= 0) args["layer"] = s.layer;
    if (s.mb >= 0) args["microbatch"] = s.mb;
    if (s.tokens >= 0) args["tokens"] = s.tokens;
    ev.push_back({{"name", s.name},
                  {"ph", "X"},
                  {"pid", s.pid},
                  {"tid", s.tid},
                  {"ts", (s.t0 - origin) / 1000.0},
                  {"dur", (s.t1 - s.t0) / 1000.0},
                  {"args", args}});
  }
  std::ofstream out(path);
  out << nlohmann::json{{"traceEvents", ev}, {"displayTimeUnit", "ms"}}.dump();
  if (!out) return io_error("cannot write trace to " + path);
  return Status::ok();
}

}  // namespace afd
