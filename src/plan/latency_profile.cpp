#include "plan/latency_profile.h"

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "plan/text_file.h"

namespace afd::plan {
namespace {

using nlohmann::json;

json model_json(const LinearModel& m) {
  json j = {{"alpha", m.alpha}, {"beta", m.beta}};
  if (m.fit) {
    j["fit"] = {{"n", m.fit->n}, {"r2", m.fit->r2}, {"rmse", m.fit->rmse}, {"max_abs_residual", m.fit->max_abs_residual}};
  }
  return j;
}

Result<LinearModel> parse_model(const json& root, const char* key, const std::string& source) {
  const std::string where = source + ": '" + key + "'";
  auto it = root.find(key);
  if (it == root.end() || !it->is_object()) return invalid_argument(where + " missing or not an object");
  LinearModel m;
  for (const char* f : {"alpha", "beta"}) {
    auto v = it->find(f);
    if (v == it->end() || !v->is_number()) return invalid_argument(where + "." + f + " missing or not a number");
  }
  m.alpha = (*it)["alpha"].get<double>();
  m.beta = (*it)["beta"].get<double>();
  if (auto fit = it->find("fit"); fit != it->end()) {
    if (!fit->is_object()) return invalid_argument(where + ".fit must be an object");
    LinearFitQuality q;
    q.n = fit->value("n", int64_t{0});
    q.r2 = fit->value("r2", 0.0);
    q.rmse = fit->value("rmse", 0.0);
    q.max_abs_residual = fit->value("max_abs_residual", 0.0);
    m.fit = q;
  }
  return m;
}

}  // namespace

Status LatencyProfile::validate() const {
  auto check = [](const LinearModel& m, const char* name) -> Status {
    if (!std::isfinite(m.alpha) || !std::isfinite(m.beta)) return invalid_argument(std::string(name) + ": non-finite alpha/beta");
    if (m.alpha < 0 || m.beta < 0) return invalid_argument(std::string(name) + ": alpha and beta must be >= 0");
    return Status();
  };
  AFD_RETURN_IF_ERROR(check(attention, "attention"));
  AFD_RETURN_IF_ERROR(check(ffn, "ffn"));
  AFD_RETURN_IF_ERROR(check(comm, "comm"));
  if (ffn.alpha <= 0) return invalid_argument("ffn: alpha must be > 0 (the ratio theory divides by it)");
  return Status();
}

LatencyProfile af_ratio_paper_profile() {
  LatencyProfile p;
  p.time_unit = "cycles";
  p.attention = {0.00165, 50, std::nullopt};
  p.ffn = {0.083, 100, std::nullopt};
  p.comm = {0.022, 20, std::nullopt};
  p.source = "A/F ratio paper Table 2 (DeepSeek-V3 on Ascend 910C)";
  return p;
}

std::string profile_to_json(const LatencyProfile& p) {
  json j = {{"format", "afd-latency-profile"},
            {"version", 1},
            {"time_unit", p.time_unit},
            {"attention", model_json(p.attention)},
            {"ffn", model_json(p.ffn)},
            {"comm", model_json(p.comm)},
            {"source", p.source}};
  return j.dump(2) + "\n";
}

Result<LatencyProfile> parse_profile_json(const std::string& text, const std::string& source) {
  AFD_ASSIGN_OR_RETURN(const json j, parse_json(text, source));
  if (!j.is_object()) return corrupt_data(source + ": expected a JSON object");
  if (j.value("format", std::string()) != "afd-latency-profile")
    return invalid_argument(source + ": 'format' must be \"afd-latency-profile\"");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != 1)
    return invalid_argument(source + ": unsupported 'version' (expected 1)");
  LatencyProfile p;
  if (j.contains("time_unit")) {
    if (!j["time_unit"].is_string()) return invalid_argument(source + ": 'time_unit' must be a string");
    p.time_unit = j["time_unit"].get<std::string>();
  }
  AFD_ASSIGN_OR_RETURN(p.attention, parse_model(j, "attention", source));
  AFD_ASSIGN_OR_RETURN(p.ffn, parse_model(j, "ffn", source));
  AFD_ASSIGN_OR_RETURN(p.comm, parse_model(j, "comm", source));
  if (j.contains("source") && j["source"].is_string()) p.source = j["source"].get<std::string>();
  Status st = p.validate();
  if (!st.is_ok()) return st.with_context(source);
  return p;
}

Result<LatencyProfile> load_profile_file(const std::string& path) {
  AFD_ASSIGN_OR_RETURN(const std::string text, read_text_file(path, "profile"));
  return parse_profile_json(text, path);
}

Status save_profile_file(const LatencyProfile& p, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return io_error("cannot write profile '" + path + "'");
  f << profile_to_json(p);
  if (!f) return io_error("write failed: '" + path + "'");
  return Status();
}

}  // namespace afd::plan
