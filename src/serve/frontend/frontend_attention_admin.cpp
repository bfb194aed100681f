#include "serve/frontend/frontend_attention_admin.h"

#include <charconv>
#include <set>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "runtime/topology_file.h"
#include "serve/api/response.h"

namespace afd::serve {

namespace {

using json = nlohmann::ordered_json;

std::pair<int, std::string> error(int status, const std::string& msg) { return {status, error_body(status, msg)}; }

std::string name_of(const FrontendWorker& w) {
  return "attention worker " + std::to_string(w.index) + " at " + w.address;
}

const char* state_name(const FrontendWorker& w) {
  if (w.membership.load() == Membership::draining) return "draining";
  return w.up.load() ? "up" : "down";
}

// The index a selector names ("2" or 2), or -1 when it is not a plain non-negative integer.
int64_t as_index(const std::string& s) {
  int64_t v = -1;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && v >= 0 ? v : -1;
}

}  // namespace

AttentionAdmin::AttentionAdmin(WorkerRoster* workers, Router* router, size_t max_slots)
    : workers_(workers), router_(router), max_slots_(max_slots) {}

std::shared_ptr<FrontendWorker> AttentionAdmin::find(const std::string& sel, bool listed_only) const {
  const auto list = workers_->snapshot();
  const int64_t idx = as_index(sel);
  for (const auto& w : *list) {
    if (listed_only && !w->listed()) continue;
    if (w->address == sel || (idx >= 0 && w->index == idx)) return w;
  }
  return nullptr;
}

std::pair<int, std::string> AttentionAdmin::request(const std::string& method, const std::string& body) {
  if (method == "GET") {
    json ws = json::array();
    for (const auto& w : *workers_->snapshot()) {
      if (!w->listed()) continue;
      json e = {{"worker", w->index}, {"address", w->address}, {"state", state_name(*w)}};
      if (std::string why = w->why_down(); !why.empty()) e["why"] = why;
      e["inflight_requests"] = w->inflight_requests.load();
      e["inflight_tokens"] = w->inflight_tokens.load();
      e["requests"] = w->requests.load();
      ws.push_back(std::move(e));
    }
    std::lock_guard<std::mutex> l(mu_);
    return {200, json{{"workers", std::move(ws)}, {"joins", joins_}, {"leaves", leaves_}}.dump()};
  }
  if (method != "POST") return error(405, "use GET or POST on /admin/attention");
  auto j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  const bool shape = !j.is_discarded() && j.is_object() &&
                     ((j.size() == 1 && j.contains("add")) ||
                      (j.contains("remove") && (j.size() == 1 || (j.size() == 2 && j.contains("migrate")))));
  if (!shape)
    return error(400,
                 R"(body must be {"add": "host:port"} or {"remove": "host:port" or worker index, "migrate"?: bool})");
  if (j.contains("add")) {
    if (!j["add"].is_string()) return error(400, "\"add\" must be a \"host:port\" string");
    return add(j["add"].get<std::string>(), "/admin/attention");
  }
  if (j.contains("migrate") && !j["migrate"].is_boolean()) return error(400, "\"migrate\" must be true or false");
  const bool migrate = j.value("migrate", false);
  const json& r = j["remove"];
  if (r.is_number_unsigned()) return remove(std::to_string(r.get<uint64_t>()), "/admin/attention", migrate);
  if (!r.is_string()) return error(400, "\"remove\" must be a \"host:port\" string or a worker index");
  return remove(r.get<std::string>(), "/admin/attention", migrate);
}

std::pair<int, std::string> AttentionAdmin::add(const std::string& address, const std::string& origin) {
  std::string host;
  int port = 0;
  if (Status s = split_host_port(address, &host, &port); !s.is_ok())
    return error(400, "cannot add attention worker '" + address + "': " + s.message());
  std::lock_guard<std::mutex> l(mu_);
  std::shared_ptr<FrontendWorker> w = find(address, /*listed_only=*/false);
  if (w && w->address != address) w = nullptr;  // an index-looking address matched by index
  const char* result = "added";
  if (w) {
    const Membership was = w->membership.load();
    if (was == Membership::active) return error(409, name_of(*w) + " is already a member");
    // A slot that left (or is leaving): it is polled again before anything is placed on it.
    if (was == Membership::removed) {
      w->set_state(false, "joined again: not checked yet");
      router_->forget(w->index);
    }
    w->membership = Membership::active;
    result = "active again";
  } else {
    const auto list = workers_->snapshot();
    if (list->size() >= max_slots_)
      return error(400, "cannot add attention worker '" + address + "': the front end has made its " +
                            std::to_string(max_slots_) + " worker slots");
    w = std::make_shared<FrontendWorker>();
    w->index = static_cast<int>(list->size());
    w->address = address;
    w->host = host;
    w->port = port;
    w->set_state(false, "joined: not checked yet");
    const auto now = workers_->append(w);
    router_->grow(static_cast<int>(now->size()));
  }
  ++joins_;
  spdlog::info("front end: admin: {} joins ({}; through {}): placed on once its /health passes", name_of(*w), result,
               origin);
  return {200, json{{"worker", w->index}, {"address", w->address}, {"result", result}}.dump()};
}

std::pair<int, std::string> AttentionAdmin::remove(const std::string& sel, const std::string& origin, bool migrate) {
  if (migrate && !migrate_) return error(400, "\"migrate\" is not available here");
  std::lock_guard<std::mutex> l(mu_);
  std::shared_ptr<FrontendWorker> w = find(sel, /*listed_only=*/true);
  if (!w) return error(404, "no attention worker at or with index '" + sel + "'");
  if (w->membership.load() == Membership::draining) {
    json out = {{"worker", w->index},
                {"address", w->address},
                {"result", "draining"},
                {"inflight_requests", w->inflight_requests.load()}};
    if (migrate) out["moved"] = migrate_(*w);  // a drain that now should not wait
    return {200, out.dump()};
  }
  int active = 0;
  for (const auto& x : *workers_->snapshot()) active += x->membership.load() == Membership::active ? 1 : 0;
  if (active <= 1) return error(409, "cannot remove " + name_of(*w) + ": it is the last active attention worker");
  w->membership = Membership::draining;
  ++leaves_;
  const int64_t inflight = w->inflight_requests.load();
  spdlog::info("front end: admin: {} leaves (through {}): draining, {} request(s) in flight {}", name_of(*w), origin,
               inflight, migrate ? "move to the other workers" : "finish there");
  json out = {{"worker", w->index}, {"address", w->address}, {"result", "draining"}, {"inflight_requests", inflight}};
  if (inflight == 0) {
    finish_removal(*w);
    out["result"] = "removed";
  } else if (migrate) {
    out["moved"] = migrate_(*w);
  }
  return {200, out.dump()};
}

std::pair<int, std::string> AttentionAdmin::set(const std::vector<std::string>& addresses, const std::string& origin) {
  if (addresses.empty()) return error(400, "an attention worker list must not be empty");
  std::set<std::string> want;
  for (const auto& a : addresses) {
    std::string host;
    int port = 0;
    if (Status s = split_host_port(a, &host, &port); !s.is_ok())
      return error(400, "attention worker '" + a + "': " + s.message());
    if (!want.insert(a).second) return error(400, "attention worker '" + a + "' is listed twice");
  }
  json added = json::array(), removed = json::array();
  // Adds first: the last active worker is never removed before its successors exist.
  for (const auto& a : addresses) {
    auto w = [&] {
      std::lock_guard<std::mutex> l(mu_);
      return find(a, /*listed_only=*/true);
    }();
    if (w && w->address == a && w->membership.load() == Membership::active) continue;
    auto r = add(a, origin);
    if (r.first != 200) return r;
    added.push_back(a);
  }
  std::vector<std::string> gone;
  for (const auto& w : *workers_->snapshot())
    if (w->membership.load() == Membership::active && !want.count(w->address)) gone.push_back(w->address);
  for (const auto& a : gone) {
    auto r = remove(a, origin);
    if (r.first != 200) return r;
    removed.push_back(a);
  }
  return {200, json{{"added", std::move(added)}, {"removed", std::move(removed)}}.dump()};
}

void AttentionAdmin::finish_removal(FrontendWorker& w) {
  w.membership = Membership::removed;
  w.set_state(false, "removed from the deployment");
  router_->forget(w.index);
  spdlog::info("front end: {} removed: drained (no request in flight)", name_of(w));
}

int AttentionAdmin::settle() {
  std::lock_guard<std::mutex> l(mu_);
  int n = 0;
  for (const auto& w : *workers_->snapshot()) {
    if (w->membership.load() != Membership::draining || w->inflight_requests.load() != 0) continue;
    finish_removal(*w);
    ++n;
  }
  return n;
}

std::string AttentionAdmin::render_metrics() const {
  int up = 0, down = 0, draining = 0, removed = 0;
  for (const auto& w : *workers_->snapshot()) {
    switch (w->membership.load()) {
      case Membership::active: (w->up.load() ? up : down)++; break;
      case Membership::draining: ++draining; break;
      case Membership::removed: ++removed; break;
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  std::string o;
  o += "# HELP afd_frontend_attention_workers Attention worker slots of the front end by state (up, down: active "
       "members by their last health check; draining: removed, requests still in flight; removed: left).\n"
       "# TYPE afd_frontend_attention_workers gauge\n";
  o += "afd_frontend_attention_workers{state=\"up\"} " + std::to_string(up) + "\n";
  o += "afd_frontend_attention_workers{state=\"down\"} " + std::to_string(down) + "\n";
  o += "afd_frontend_attention_workers{state=\"draining\"} " + std::to_string(draining) + "\n";
  o += "afd_frontend_attention_workers{state=\"removed\"} " + std::to_string(removed) + "\n";
  o += "# HELP afd_frontend_attention_membership_changes_total Attention workers that joined (added, or added "
       "again) and left (removed: drained, then dropped) through /admin/attention or a topology file reload.\n"
       "# TYPE afd_frontend_attention_membership_changes_total counter\n";
  o += "afd_frontend_attention_membership_changes_total{change=\"join\"} " + std::to_string(joins_) + "\n";
  o += "afd_frontend_attention_membership_changes_total{change=\"leave\"} " + std::to_string(leaves_) + "\n";
  return o;
}

}  // namespace afd::serve
