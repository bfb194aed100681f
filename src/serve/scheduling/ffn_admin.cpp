#include "serve/scheduling/ffn_admin.h"

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "serve/api/response.h"

namespace afd::serve {

namespace {

using json = nlohmann::ordered_json;

std::pair<int, std::string> error(int status, const std::string& msg) { return {status, error_body(status, msg)}; }

int http_status(const Status& s) {
  switch (s.code()) {
    case StatusCode::not_found: return 404;
    case StatusCode::not_supported: return 409;
    default: return 400;
  }
}

// A member given as "host:port" or {"address": "host:port", "name": "ffn1"}.
Result<FfnMember> member_of(const json& j, const std::string& where) {
  if (j.is_string()) return FfnMember{j.get<std::string>(), ""};
  if (!j.is_object()) return invalid_argument(where + ": expected \"host:port\" or {\"address\": ..., \"name\": ...}");
  FfnMember m;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string()) return invalid_argument(where + "." + it.key() + ": must be a string");
    if (it.key() == "address") m.address = it.value().get<std::string>();
    else if (it.key() == "name") m.name = it.value().get<std::string>();
    else return invalid_argument(where + ": unknown field \"" + it.key() + "\" (address, name)");
  }
  if (m.address.empty()) return invalid_argument(where + ": \"address\" is required");
  return m;
}

}  // namespace

std::string ffn_membership_json(std::span<FfnClient* const> clients) {
  json engines = json::array();
  for (size_t i = 0; i < clients.size(); ++i) {
    const FfnMembership m = clients[i]->membership();
    json members = json::array();
    for (const auto& x : m.members) {
      json e = {{"name", x.name},       {"address", x.address}, {"connected", x.connected},
                {"assigned", x.assigned}, {"removed", x.removed}};
      if (x.assigned) {
        e["experts"] = json::array({x.expert_begin, x.expert_end});
        e["shared"] = x.holds_shared;
      }
      e["unreachable_ms"] = x.unreachable_ms;
      members.push_back(std::move(e));
    }
    engines.push_back({{"worker", i},
                       {"epoch", m.epoch},
                       {"applied_epoch", m.applied_epoch},
                       {"live", m.assigned},
                       {"takeovers", m.takeovers},
                       {"rejoins", m.rejoins},
                       {"leaves", m.leaves},
                       {"whole_experts", m.whole_experts},
                       {"members", std::move(members)}});
  }
  return json{{"engines", std::move(engines)}}.dump();
}

std::pair<int, std::string> ffn_admin_request(std::span<FfnClient* const> clients, const std::string& method,
                                              const std::string& body) {
  if (clients.empty()) return error(404, "this server has no FFN workers (it is not an AFD attention worker)");
  if (method == "GET") return {200, ffn_membership_json(clients)};
  if (method != "POST") return error(405, "use GET or POST on /admin/ffn");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return error(400, "body must be a JSON object");
  if (j.size() != 1 && !(j.size() == 2 && j.contains("add") && j.contains("name"))) {
    return error(400, "expected one of {\"add\": \"host:port\"[, \"name\": ...]}, {\"remove\": \"host:port\"|name}, "
                      "{\"members\": [...]}");
  }
  std::string what;
  for (size_t i = 0; i < clients.size(); ++i) {
    Status s;
    if (j.contains("add")) {
      if (!j["add"].is_string() || (j.contains("name") && !j["name"].is_string()))
        return error(400, "\"add\" and \"name\" must be strings");
      FfnMember m{j["add"].get<std::string>(), j.contains("name") ? j["name"].get<std::string>() : ""};
      what = "add " + m.address;
      s = clients[i]->add_member(std::move(m));
    } else if (j.contains("remove")) {
      if (!j["remove"].is_string()) return error(400, "\"remove\" must be a string");
      what = "remove " + j["remove"].get<std::string>();
      s = clients[i]->remove_member(j["remove"].get<std::string>());
    } else if (j.contains("members")) {
      if (!j["members"].is_array()) return error(400, "\"members\" must be an array");
      std::vector<FfnMember> list;
      for (size_t k = 0; k < j["members"].size(); ++k) {
        auto m = member_of(j["members"][k], "members[" + std::to_string(k) + "]");
        if (!m.ok()) return error(400, m.status().message());
        list.push_back(std::move(*m));
      }
      what = "set " + std::to_string(list.size()) + " members";
      s = clients[i]->set_members(std::move(list));
    } else {
      return error(400, "unknown request: expected \"add\", \"remove\" or \"members\"");
    }
    if (!s.is_ok()) {
      spdlog::warn("admin: FFN membership change ({}) refused by engine {}: {}", what, i, s.to_string());
      return error(http_status(s), (clients.size() > 1 ? "engine " + std::to_string(i) + ": " : "") + s.message());
    }
  }
  spdlog::info("admin: FFN membership change: {}", what);
  return {200, ffn_membership_json(clients)};
}

}  // namespace afd::serve
