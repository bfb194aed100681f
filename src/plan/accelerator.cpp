#include "plan/accelerator.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "plan/text_file.h"

namespace afd::plan {
namespace {

constexpr double kGbps = 1e9 / 8.0;  // bytes/s per Gbit/s
constexpr double kGB = 1e9;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

Accelerator make(const char* id, const char* display, std::optional<double> price, double bf16, double fp8,
                 double bw, double mem, double nic_gbps, const char* source) {
  Accelerator a;
  a.id = id;
  a.display = display;
  a.usd_per_hour = price;
  a.flops_bf16 = bf16;
  a.flops_fp8 = fp8;
  a.mem_bw = bw;
  a.mem_bytes = mem;
  a.net_bw = nic_gbps * kGbps;
  a.source = source;
  return a;
}

}  // namespace

Status Accelerator::validate() const {
  if (id.empty()) return invalid_argument("accelerator: empty id");
  if (!(flops_bf16 > 0)) return invalid_argument("accelerator " + id + ": flops_bf16 must be > 0");
  if (flops_fp8 < 0) return invalid_argument("accelerator " + id + ": flops_fp8 must be >= 0");
  if (!(mem_bw > 0)) return invalid_argument("accelerator " + id + ": mem_bw must be > 0");
  if (mem_bytes < 0 || net_bw < 0) return invalid_argument("accelerator " + id + ": negative mem_bytes/net_bw");
  if (cards_per_server < 1) return invalid_argument("accelerator " + id + ": cards_per_server must be >= 1");
  if (usd_per_hour && !(*usd_per_hour > 0)) return invalid_argument("accelerator " + id + ": usd_per_hour must be > 0");
  return Status();
}

std::vector<Accelerator> accelerator_presets() {
  // Step-3 paper, Table 4: price, BF16, FP8, bandwidth. Memory sizes and NICs: the Step-3 paper, §5.4
  // (400 Gbps x 8 for H800/H20, 200 Gbps x 8 for A800/910B).
  const char* t4 = "Step-3 paper Table 4, §5.4";
  return {
      make("h800", "NVIDIA H800", 2.0, 9.89e14, 1.98e15, 3.35e12, 80 * kGB, 400, t4),
      make("h20", "NVIDIA H20", 0.8, 1.48e14, 2.96e14, 4.00e12, 96 * kGB, 400, t4),
      make("a800", "NVIDIA A800", 0.75, 3.12e14, 0, 2.00e12, 80 * kGB, 200, t4),
      make("910b", "Ascend 910B", 0.67, 2.80e14, 0, 1.60e12, 64 * kGB, 200, t4),
      // No price in the papers: usd_per_hour unset (pass --price id=USD or a JSON file).
      make("h100", "NVIDIA H100 SXM", std::nullopt, 9.89e14, 1.979e15, 3.35e12, 80 * kGB, 400,
           "NVIDIA H100 datasheet (SXM5, dense)"),
      make("h200", "NVIDIA H200 SXM", std::nullopt, 9.89e14, 1.979e15, 4.8e12, 141 * kGB, 400,
           "NVIDIA H200 datasheet (SXM, dense)"),
      make("l20", "NVIDIA L20", std::nullopt, 1.195e14, 2.39e14, 8.64e11, 48 * kGB, 200,
           "NVIDIA L20 product brief; 864 GB/s also Step-3 paper §6"),
      make("l4", "NVIDIA L4", std::nullopt, 1.21e14, 2.425e14, 3.00e11, 24 * kGB, 200,
           "NVIDIA L4 datasheet (dense = half the sparse figures); 300 GB/s also Step-3 paper §6"),
  };
}

Result<Accelerator> find_accelerator(const std::string& name) {
  const std::string n = lower(name);
  std::string known;
  for (auto& a : accelerator_presets()) {
    if (a.id == n) return a;
    known += (known.empty() ? "" : ", ") + a.id;
  }
  return not_found("unknown accelerator '" + name + "' (presets: " + known + "; or give a JSON file path)");
}

Result<std::vector<Accelerator>> parse_accelerators_json(const std::string& text, const std::string& source) {
  AFD_ASSIGN_OR_RETURN(nlohmann::json j, parse_json(text, source));
  std::vector<nlohmann::json> items;
  if (j.is_array()) {
    for (auto& x : j) items.push_back(x);
  } else if (j.is_object()) {
    items.push_back(j);
  } else {
    return corrupt_data(source + ": expected an object or an array of objects");
  }
  std::vector<Accelerator> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& o = items[i];
    const std::string where = source + "[" + std::to_string(i) + "]";
    if (!o.is_object()) return corrupt_data(where + ": not an object");
    Accelerator a;
    auto num = [&](const char* key, double* dst, bool required) -> Status {
      auto it = o.find(key);
      if (it == o.end()) return required ? invalid_argument(where + ": missing field '" + key + "'") : Status();
      if (!it->is_number()) return invalid_argument(where + ": field '" + key + "' must be a number");
      *dst = it->get<double>();
      return Status();
    };
    auto it = o.find("id");
    if (it == o.end() || !it->is_string()) return invalid_argument(where + ": missing string field 'id'");
    a.id = lower(it->get<std::string>());
    a.display = o.value("display", a.id);
    if (o.contains("display") && !o["display"].is_string()) return invalid_argument(where + ": 'display' must be a string");
    a.source = source;
    if (o.contains("source") && o["source"].is_string()) a.source = o["source"].get<std::string>();
    double price = 0;
    if (o.contains("usd_per_hour")) {
      AFD_RETURN_IF_ERROR(num("usd_per_hour", &price, true));
      a.usd_per_hour = price;
    }
    AFD_RETURN_IF_ERROR(num("flops_bf16", &a.flops_bf16, true));
    AFD_RETURN_IF_ERROR(num("flops_fp8", &a.flops_fp8, false));
    AFD_RETURN_IF_ERROR(num("mem_bw", &a.mem_bw, true));
    AFD_RETURN_IF_ERROR(num("mem_bytes", &a.mem_bytes, false));
    AFD_RETURN_IF_ERROR(num("net_bw", &a.net_bw, false));
    double cps = 8;
    AFD_RETURN_IF_ERROR(num("cards_per_server", &cps, false));
    if (cps < 1 || cps > 1e6 || cps != static_cast<double>(static_cast<int>(cps)))
      return invalid_argument(where + ": 'cards_per_server' must be a positive integer");
    a.cards_per_server = static_cast<int>(cps);
    Status st = a.validate();
    if (!st.is_ok()) return st.with_context(where);
    out.push_back(std::move(a));
  }
  return out;
}

Result<std::vector<Accelerator>> load_accelerators_file(const std::string& path) {
  AFD_ASSIGN_OR_RETURN(const std::string text, read_text_file(path, "accelerator file"));
  return parse_accelerators_json(text, path);
}

Result<std::vector<Accelerator>> resolve_accelerators(const std::vector<std::string>& names) {
  std::vector<Accelerator> out;
  for (const auto& n : names) {
    auto preset = find_accelerator(n);
    if (preset.ok()) {
      out.push_back(std::move(preset).value());
      continue;
    }
    std::error_code ec;
    if (!std::filesystem::exists(n, ec)) return preset.status();
    AFD_ASSIGN_OR_RETURN(auto list, load_accelerators_file(n));
    for (auto& a : list) out.push_back(std::move(a));
  }
  return out;
}

}  // namespace afd::plan
