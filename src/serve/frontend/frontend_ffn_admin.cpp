#include "serve/frontend/frontend_ffn_admin.h"

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "serve/api/response.h"
#include "serve/frontend/proxy_client.h"

namespace afd::serve {

namespace {

using json = nlohmann::ordered_json;

constexpr size_t kMaxAnswer = 1 << 20;  // a membership answer is a few hundred bytes per member

std::pair<int, std::string> error(int status, const std::string& msg) { return {status, error_body(status, msg)}; }

// The message of a worker's OpenAI-style error body, else its status.
std::string refusal(int status, const std::string& body) {
  auto j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return "answered " + std::to_string(status);
}

std::string worker_name(const FrontendWorker& w) {
  return "attention worker " + std::to_string(w.index) + " at " + w.address;
}

}  // namespace

FfnFanout::FfnFanout(const WorkerRoster* workers, int timeout_ms, std::string api_key)
    : workers_(workers), timeout_ms_(timeout_ms), api_key_(std::move(api_key)) {}

FfnFanout::WorkerState& FfnFanout::state(size_t i) {
  if (state_.size() <= i) state_.resize(i + 1);
  return state_[i];
}

Result<std::pair<int, std::string>> FfnFanout::call(const FrontendWorker& w, const char* method,
                                                    const std::string& body) const {
  std::vector<std::pair<std::string, std::string>> headers;
  if (!api_key_.empty()) headers.emplace_back("Authorization", "Bearer " + api_key_);
  Result<HttpAnswer> a = std::string(method) == "GET"
                             ? http_get(w.host, w.port, "/admin/ffn", timeout_ms_, kMaxAnswer)
                             : http_post(w.host, w.port, "/admin/ffn", body, headers, timeout_ms_, kMaxAnswer);
  if (!a.ok()) return a.status();
  return std::make_pair(a->status, std::move(a->body));
}

std::string FfnFanout::members_list_json() const {
  json list = json::array();
  for (const Member& m : members_) {
    json e = {{"address", m.address}};
    if (!m.name.empty()) e["name"] = m.name;
    list.push_back(std::move(e));
  }
  return json{{"members", std::move(list)}}.dump();
}

std::pair<int, std::string> FfnFanout::request(const std::string& method, const std::string& body) {
  if (method == "GET") return get();
  if (method != "POST") return error(405, "use GET or POST on /admin/ffn");
  return post(body);
}

bool FfnFanout::current(size_t i) const {
  if (changes_ == 0) return true;
  if (i >= state_.size()) return false;  // never given anything
  return state_[i].change == changes_ && state_[i].instance == state_[i].seen;
}

std::pair<int, std::string> FfnFanout::get() {
  json out;
  const auto list = workers_->snapshot();
  std::vector<bool> is_current(list->size());
  {
    std::lock_guard<std::mutex> l(mu_);
    out["members"] = changes_ == 0 ? json(nullptr) : json::parse(members_list_json())["members"];
    out["changes"] = changes_;
    for (size_t i = 0; i < list->size(); ++i) is_current[i] = current(i);
  }
  json ws = json::array();
  for (size_t i = 0; i < list->size(); ++i) {
    const FrontendWorker& w = *(*list)[i];
    if (!w.listed()) continue;
    json e = {{"worker", w.index}, {"address", w.address}, {"up", w.up.load()}, {"current", is_current[i]}};
    auto a = call(w, "GET", "");
    if (!a.ok()) {
      e["error"] = a.status().message();
    } else if (a->first != 200) {
      e["error"] = refusal(a->first, a->second);
    } else {
      auto j = json::parse(a->second, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("engines") && j["engines"].is_array() && !j["engines"].empty())
        e["membership"] = j["engines"][0];
      else e["error"] = "its /admin/ffn answer has no membership";
    }
    ws.push_back(std::move(e));
  }
  out["workers"] = std::move(ws);
  return {200, out.dump()};
}

std::pair<int, std::string> FfnFanout::post(const std::string& body) {
  auto j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return error(400, "body must be a JSON object");
  // What the log names: the request re-serialised (one line), cut to a sane length.
  std::string what = j.dump();
  if (what.size() > 200) what = what.substr(0, 200) + "...";
  std::lock_guard<std::mutex> change(change_mu_);
  json results = json::array();
  std::vector<Member> now;  // the membership the first accepting worker reports
  bool defined = false;
  std::vector<size_t> applied;
  std::string later;  // "worker 1 (why); ..." for the log
  const auto roster = workers_->snapshot();
  for (size_t i = 0; i < roster->size(); ++i) {
    const FrontendWorker& w = *(*roster)[i];
    if (!w.listed()) continue;
    json r = {{"worker", w.index}, {"address", w.address}};
    std::string why;
    if (!w.up.load()) {
      why = "down: " + w.why_down();
    } else if (auto a = call(w, "POST", body); !a.ok()) {
      why = a.status().message();
    } else if (a->first != 200) {
      why = refusal(a->first, a->second);
      // The first worker that answers decides: a refusal there changed nothing anywhere.
      if (!defined) {
        std::lock_guard<std::mutex> l(mu_);
        ++refused_;
        spdlog::warn("front end: admin: FFN membership change {} refused by {}: {}", what, worker_name(w), why);
        return error(a->first, worker_name(w) + ": " + why);
      }
    } else {
      auto m = json::parse(a->second, nullptr, /*allow_exceptions=*/false);
      const bool has = m.is_object() && m.contains("engines") && m["engines"].is_array() && !m["engines"].empty() &&
                       m["engines"][0].contains("members") && m["engines"][0]["members"].is_array();
      if (!has) {
        why = "its answer has no membership";
      } else {
        if (!defined) {
          for (const auto& x : m["engines"][0]["members"]) {
            if (!x.is_object() || x.value("removed", false)) continue;
            now.push_back(Member{x.value("address", std::string()), x.value("name", std::string())});
          }
          defined = true;
        }
        applied.push_back(i);
        r["result"] = "applied";
      }
    }
    if (!why.empty()) {
      r["result"] = "later";
      r["error"] = why;
      later += (later.empty() ? "" : "; ") + ("worker " + std::to_string(w.index) + ": " + why);
    }
    results.push_back(std::move(r));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (!defined) {
    ++refused_;
    return error(503, "no attention worker took the FFN membership change (" + later + ")");
  }
  members_ = std::move(now);
  ++changes_;
  for (size_t i : applied) {
    state(i).change = changes_;
    state(i).instance = state(i).seen;
  }
  std::string list, ids;
  for (const Member& m : members_)
    list += (list.empty() ? "" : ", ") + (m.name.empty() ? "" : m.name + " ") + m.address;
  for (size_t i : applied) ids += (ids.empty() ? "" : ", ") + std::to_string((*roster)[i]->index);
  spdlog::info(
      "front end: admin: FFN membership change {} (change {}) applied by attention worker(s) {}{}; FFN "
      "members now: {}",
      what, changes_, ids, later.empty() ? "" : " (the others get it once up: " + later + ")", list);
  json out = json::parse(members_list_json());
  out["changes"] = changes_;
  out["workers"] = std::move(results);
  return {200, out.dump()};
}

Status FfnFanout::reconcile(const FrontendWorker& w, const std::string& instance) {
  const size_t i = static_cast<size_t>(w.index);
  bool restarted = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    restarted = !state(i).seen.empty() && state(i).seen != instance;
    state(i).seen = instance;
    if (current(i)) return Status();
  }
  // A change being applied meanwhile gives the worker what it needs, or leaves it to the next
  // health check: never two exchanges with a worker at once (a late list must not land after
  // a newer change).
  std::unique_lock<std::mutex> change(change_mu_, std::try_to_lock);
  if (!change.owns_lock()) return unavailable("an FFN membership change is being applied to the attention workers");
  std::string list;
  uint64_t number = 0;
  size_t n_members = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (current(i)) return Status();
    list = members_list_json();
    number = changes_;
    n_members = members_.size();
  }
  auto a = call(w, "POST", list);
  if (!a.ok() || a->first != 200) {
    const std::string why = a.ok() ? refusal(a->first, a->second) : a.status().message();
    return unavailable("could not give it the FFN membership set through the front end's /admin/ffn: " + why);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    state(i).change = number;
    state(i).instance = instance;
    ++state(i).pushes;
  }
  spdlog::info("front end: {} {}: gave it the FFN membership of change {} ({} member(s))", worker_name(w),
               restarted ? "is a new process (restarted)" : "had not got the last change", number, n_members);
  return Status();
}

std::string FfnFanout::render_metrics() const {
  const auto list = workers_->snapshot();
  std::lock_guard<std::mutex> l(mu_);
  if (state_.size() < list->size()) state_.resize(list->size());
  std::string o;
  o += "# HELP afd_frontend_ffn_membership_changes_total FFN membership changes through the front end's /admin/ffn, "
       "by result.\n# TYPE afd_frontend_ffn_membership_changes_total counter\n";
  o += "afd_frontend_ffn_membership_changes_total{result=\"applied\"} " + std::to_string(changes_) + "\n";
  o += "afd_frontend_ffn_membership_changes_total{result=\"refused\"} " + std::to_string(refused_) + "\n";
  o += "# HELP afd_frontend_ffn_members FFN workers in the membership set through /admin/ffn (0: none set; the "
       "attention workers keep their start-up lists).\n# TYPE afd_frontend_ffn_members gauge\n";
  o += "afd_frontend_ffn_members " + std::to_string(changes_ == 0 ? 0 : members_.size()) + "\n";
  auto label = [](const FrontendWorker& w) {
    return "{worker=\"" + std::to_string(w.index) + "\",address=\"" + w.address + "\"} ";
  };
  o += "# HELP afd_frontend_ffn_membership_pushes_total Times the whole FFN membership was given to an attention "
       "worker that had not got the last change (down, refused, or restarted since).\n"
       "# TYPE afd_frontend_ffn_membership_pushes_total counter\n";
  for (size_t i = 0; i < list->size(); ++i)
    if ((*list)[i]->listed())
      o += "afd_frontend_ffn_membership_pushes_total" + label(*(*list)[i]) + std::to_string(state_[i].pushes) + "\n";
  o += "# HELP afd_frontend_ffn_membership_current 1 if the attention worker holds the FFN membership set through "
       "/admin/ffn (or none was set).\n# TYPE afd_frontend_ffn_membership_current gauge\n";
  for (size_t i = 0; i < list->size(); ++i)
    if ((*list)[i]->listed())
      o += "afd_frontend_ffn_membership_current" + label(*(*list)[i]) + (current(i) ? "1" : "0") + "\n";
  return o;
}

}  // namespace afd::serve
