#include "serve/frontend/frontend_reload.h"

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "runtime/topology_file.h"
#include "serve/api/response.h"

namespace afd::serve {

namespace {

using json = nlohmann::ordered_json;

std::vector<std::string> addresses(const std::vector<TopologyWorker>& ws) {
  std::vector<std::string> out;
  for (const auto& w : ws) out.push_back(w.address);
  return out;
}

}  // namespace

Result<std::unique_ptr<TopologyReload>> TopologyReload::create(std::string path, AttentionAdmin* attention,
                                                               FfnFanout* ffn) {
  AFD_ASSIGN_OR_RETURN(TopologyFile t, load_topology_file(path));
  std::unique_ptr<TopologyReload> r(new TopologyReload());
  r->path_ = std::move(path);
  r->attention_ = attention;
  r->ffn_ = ffn;
  r->ffn_addresses_ = addresses(t.ffn);
  return r;
}

std::pair<int, std::string> TopologyReload::reload(const std::string& origin) {
  std::lock_guard<std::mutex> l(mu_);
  const std::string what = "topology file reload (" + origin + ")";
  auto t = load_topology_file(path_);
  if (!t.ok()) {
    spdlog::error("front end: {}: {}: nothing changed", what, t.status().message());
    return {400, error_body(400, t.status().message() + " (nothing changed)")};
  }
  auto [code, body] = attention_->set(addresses(t->attention), what);
  if (code != 200) {
    spdlog::error("front end: {}: {}: {}", what, path_, body);
    return {code, body};
  }
  json out = {{"attention", json::parse(body)}};
  const std::vector<std::string> ffn = addresses(t->ffn);
  if (ffn == ffn_addresses_) {
    out["ffn"] = "unchanged";
  } else {
    json members = json::array();
    for (const auto& a : ffn) members.push_back({{"address", a}});
    auto [fc, fb] = ffn_->request("POST", json{{"members", std::move(members)}}.dump());
    if (fc != 200) {
      spdlog::error("front end: {}: {}: the attention workers are applied; the FFN membership is not: {}", what, path_,
                    fb);
      return {fc, fb};
    }
    ffn_addresses_ = ffn;
    out["ffn"] = json::parse(fb);
  }
  spdlog::info("front end: {}: {} applied: {}", what, path_, out.dump());
  return {200, out.dump()};
}

}  // namespace afd::serve
