#include "serve/frontend/frontend.h"

#include <chrono>
#include <ctime>
#include <sstream>

#include "core/log.h"
#include "model/config.h"
#include "runtime/topology_file.h"
#include "serve/metrics/metrics.h"
#include "serve/http/client_connection.h"
#include "serve/http/server.h"
#include "serve/api/response.h"

namespace afd::serve {

Result<std::unique_ptr<Frontend>> Frontend::create(FrontendOptions opt) {
  if (opt.workers.empty()) return invalid_argument("front end: no attention worker addresses");
  std::unique_ptr<Frontend> f(new Frontend());
  AFD_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(opt.model_dir));
  AFD_ASSIGN_OR_RETURN(f->model_, load_model_serving(opt.model_dir, opt.model_name, opt.max_context, cfg));
  f->model_.limits.content_special_as_text = opt.server.content_special_as_text;
  WorkerList initial;
  for (size_t i = 0; i < opt.workers.size(); ++i) {
    auto w = std::make_shared<FrontendWorker>();
    w->index = static_cast<int>(i);
    w->address = opt.workers[i];
    if (Status s = split_host_port(w->address, &w->host, &w->port); !s.is_ok())
      return s.with_context("attention worker " + std::to_string(i));
    initial.push_back(std::move(w));
  }
  f->workers_ = std::make_unique<WorkerRoster>(std::move(initial));
  f->router_ = std::make_unique<Router>(
      static_cast<int>(opt.workers.size()),
      [ws = f->workers_.get()](int w) {
        const auto list = ws->snapshot();
        return static_cast<size_t>(w) < list->size() ? (*list)[w]->inflight_tokens.load() : 0;
      },
      16);
  f->ffn_admin_ = std::make_unique<FfnFanout>(f->workers_.get(), opt.health_timeout_ms * 5, opt.server.api_key);
  f->attention_admin_ = std::make_unique<AttentionAdmin>(f->workers_.get(), f->router_.get());
  // "migrate": the requests in flight on a leaving worker continue elsewhere (failover path).
  f->attention_admin_->set_migrate([raw = f.get()](const FrontendWorker& w) {
    int n = 0;
    std::lock_guard<std::mutex> l(raw->sessions_mu_);
    for (auto& wp : raw->sessions_)
      if (auto p = wp.lock()) n += p->move_off(w) ? 1 : 0;
    return n;
  });
  if (!opt.topology_file.empty()) {
    AFD_ASSIGN_OR_RETURN(f->reload_,
                         TopologyReload::create(opt.topology_file, f->attention_admin_.get(), f->ffn_admin_.get()));
  }
  f->opt_ = std::move(opt);
  f->opt_.proxy.retry_after_s = f->opt_.server.retry_after_s;
  f->pool_.workers = f->workers_.get();
  f->pool_.router = f->router_.get();
  f->pool_.tokenizer = f->model_.tokenizer.get();
  f->pool_.policy = f->opt_.proxy;
  f->pool_.counters = &f->counters_;
  f->pool_.stopping = [raw = f.get()] { return raw->stopping_.load(); };
  f->pool_.why_down = [raw = f.get()](const std::vector<std::string>* attempts) {
    return raw->why_workers_down(attempts);
  };
  f->api_ = std::make_unique<ApiServer>(f->opt_.server, "front end request handler", f->model_, *f);
  return f;
}

Frontend::~Frontend() {
  stop();
  if (health_.joinable()) health_.join();
  // The sessions were cancelled by stop(); give their handlers a moment to let go.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    {
      std::lock_guard<std::mutex> l(sessions_mu_);
      std::erase_if(sessions_, [](const std::weak_ptr<ProxySession>& p) { return p.expired(); });
      if (sessions_.empty()) break;
    }
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Status Frontend::start() {
  AFD_RETURN_IF_ERROR(api_->bind());
  port_ = api_->port();
  health_ = std::thread([this] { health_loop(); });
  return Status();
}

Status Frontend::run() {
  if (port_ < 0) AFD_RETURN_IF_ERROR(start());
  return api_->run();
}

void Frontend::stop() {
  {
    std::lock_guard<std::mutex> l(health_mu_);
    stopping_ = true;
  }
  health_cv_.notify_all();
  {
    std::lock_guard<std::mutex> l(sessions_mu_);
    for (auto& wp : sessions_)
      if (auto p = wp.lock()) p->cancel();
  }
  if (api_) api_->stop();
}

int Frontend::workers_up() const { return serve::workers_up(*workers_->snapshot()); }

WorkerList Frontend::listed_workers() const {
  WorkerList out;
  for (const auto& w : *workers_->snapshot())
    if (w->listed()) out.push_back(w);
  return out;
}

std::pair<int, std::string> Frontend::reload(const std::string& origin) {
  if (!reload_)
    return {404, error_body(404, "no topology file to reload (afd serve --topology-file without --spawn-workers)")};
  return reload_->reload(origin);
}

namespace {

// Why a worker's answer (to /health, or a 503 to a request) is not ok: no answer, or the
// worker's own reason (the non-empty message of its OpenAI-style error body), else its
// status code. Never empty.
std::string health_failure(const Result<HttpAnswer>& st) {
  if (!st.ok()) return st.status().message();
  auto j = nlohmann::json::parse(st->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty()) {
    std::string why = j["error"]["message"].get<std::string>();
    if (why.size() > 300) why = why.substr(0, 300) + "...";  // it goes into our own answers
    return why;
  }
  return "answered " + std::to_string(st->status) + " without a reason";
}

// Why a worker that answered /health 200 must still not get requests: it is not an
// attention server (an FFN worker's metrics port, say), or it serves another model than
// this front end's (by model_config_fingerprint). Empty when it may. Bodies without these
// fields (older workers) are taken as they are.
std::string identity_mismatch(const std::string& body, const ModelServing& mine) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  if (j.contains("role") && j["role"].is_string() && j["role"] != "attention")
    return "not an attention worker: its /health says role '" + j["role"].get<std::string>() + "'";
  if (j.contains("model_config") && j["model_config"].is_string()) {
    const std::string fp = config_fingerprint_hex(mine);
    if (j["model_config"] != fp) {
      std::string theirs = j.contains("model") && j["model"].is_string() ? j["model"].get<std::string>() : "?";
      if (theirs.size() > 100) theirs = theirs.substr(0, 100) + "...";
      return "serves another model: '" + theirs + "' (config fingerprint " + j["model_config"].get<std::string>() +
             "), this front end '" + mine.limits.model_name + "' (" + fp + ")";
    }
  }
  return "";
}

// The "system_fingerprint" of a worker's /health answer ("" if it has none).
std::string health_system_fingerprint(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("system_fingerprint") && j["system_fingerprint"].is_string())
    return j["system_fingerprint"].get<std::string>();
  return "";
}

// The "instance" of a worker's /health answer ("" if it has none: an older worker).
std::string health_instance(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("instance") && j["instance"].is_string()) return j["instance"].get<std::string>();
  return "";
}

}  // namespace

std::string Frontend::why_workers_down(const std::vector<std::string>* attempts) const {
  std::string out;
  for (const auto& w : listed_workers()) {
    const size_t i = static_cast<size_t>(w->index);
    const bool tried = attempts && i < attempts->size() && !(*attempts)[i].empty();
    const std::string why = tried ? (*attempts)[i] : w->why_down();
    if (why.empty()) continue;  // up
    out += (out.empty() ? "" : "; ") + ("worker " + std::to_string(w->index) + ": " + why);
  }
  // Worker processes that will not come back (restarts exhausted) come first: they are why
  // the others report what they report (e.g. their FFN worker not connected).
  if (opt_.lost_workers) {
    if (std::string lost = opt_.lost_workers(); !lost.empty())
      out = "lost for good: " + lost + (out.empty() ? "" : "; " + out);
  }
  return out;
}

void Frontend::health_loop() {
  using clock = std::chrono::steady_clock;
  std::vector<clock::time_point> last_wait_log;
  bool announced = false;
  for (;;) {
    attention_admin_->settle();  // drained workers leave before this round
    const auto list = workers_->snapshot();
    last_wait_log.resize(list->size(), clock::time_point{});
    for (size_t i = 0; i < list->size(); ++i) {
      FrontendWorker& w = *(*list)[i];
      if (!w.listed()) continue;
      auto st = http_get(w.host, w.port, "/health", opt_.health_timeout_ms, 64 << 10);
      if (!w.listed()) continue;  // removed meanwhile: its state stays as the removal left it
      const std::string mismatch = st.ok() && st->status == 200 ? identity_mismatch(st->body, model_) : "";
      bool up = st.ok() && st->status == 200 && mismatch.empty();
      std::string why = up ? "" : !mismatch.empty() ? mismatch : health_failure(st);
      // A worker is placed on only once it holds the FFN membership set through /admin/ffn.
      if (up) {
        if (Status r = ffn_admin_->reconcile(w, health_instance(st->body)); !r.is_ok()) {
          up = false;
          why = r.message();
        }
      }
      if (up) w.set_numerics(health_system_fingerprint(st->body));
      const bool was = w.set_state(up, why);
      if (up && !was) {
        spdlog::info("front end: attention worker {} at {} is up", i, w.address);
        w.ever_up = true;
      } else if (!up && was) {
        spdlog::warn("front end: attention worker {} at {} is down ({})", i, w.address, w.why_down());
      } else if (!up && clock::now() - last_wait_log[i] > std::chrono::seconds(5)) {
        spdlog::info("front end: waiting for attention worker {} at {}{} ({})", i, w.address,
                     w.ever_up ? " (lost)" : "", w.why_down());
        last_wait_log[i] = clock::now();
      }
    }
    if (!announced && workers_up() == workers_listed(*list)) {
      announced = true;
      if (opt_.on_all_up) opt_.on_all_up(port_);
    }
    std::unique_lock<std::mutex> l(health_mu_);
    if (health_cv_.wait_for(l, std::chrono::milliseconds(opt_.health_interval_ms), [this] { return stopping_.load(); }))
      return;
  }
}

void Frontend::count_response(int status) {
  std::lock_guard<std::mutex> l(counts_mu_);
  ++responses_[status];
}

std::string Frontend::render_metrics() const {
  std::ostringstream o;
  auto family = [&](const char* name, const char* type, const char* help) {
    std::string h;
    prom_header(&h, name, type, help);
    o << h;
  };
  auto counter = [&](const char* name, const char* help, uint64_t value) {
    family(name, "counter", help);
    o << name << ' ' << value << '\n';
  };
  auto labels = [](const FrontendWorker& w) {
    return "{worker=\"" + std::to_string(w.index) + "\",address=\"" + w.address + "\"}";
  };
  const WorkerList ws = listed_workers();
  auto per_worker = [&](const char* name, const char* type, const char* help, auto value) {
    family(name, type, help);
    for (const auto& w : ws) o << name << labels(*w) << ' ' << value(*w) << '\n';
  };
  per_worker("afd_frontend_worker_up", "gauge", "1 if the attention worker answered its last health check.",
             [](const FrontendWorker& w) { return w.up ? 1 : 0; });
  per_worker("afd_frontend_worker_requests_total", "counter", "Requests placed on each attention worker.",
             [](const FrontendWorker& w) { return w.requests.load(); });
  per_worker("afd_frontend_worker_failures_total", "counter",
             "Exchanges with the attention worker that failed (refused, broken or silent mid-response).",
             [](const FrontendWorker& w) { return w.failures.load(); });
  per_worker("afd_frontend_worker_inflight_requests", "gauge", "Requests being proxied to each attention worker.",
             [](const FrontendWorker& w) { return w.inflight_requests.load(); });
  per_worker("afd_frontend_worker_inflight_tokens", "gauge", "Prompt + max_tokens of the requests being proxied.",
             [](const FrontendWorker& w) { return w.inflight_tokens.load(); });
  counter("afd_frontend_retries_total",
          "Placements repeated on another worker before any worker accepted the request.",
          counters_.retries);
  counter("afd_frontend_failovers_total",
          "Requests continued on another attention worker after theirs failed mid-request.",
          counters_.failovers);
  counter("afd_frontend_upstream_stalls_total",
          "Exchanges given up because the attention worker sent nothing for --upstream-idle-timeout-s.",
          counters_.stalls);
  counter("afd_frontend_unavailable_total",
          "Requests answered 503 because no attention worker was up or none took them over in time.",
          counters_.unavailable);
  counter("afd_frontend_waited_total",
          "New requests that found no attention worker to take them and waited (--wait-for-worker-s).",
          counters_.waited);
  family("afd_frontend_responses_total", "counter", "Answers to /v1/* requests by HTTP status.");
  {
    std::lock_guard<std::mutex> l(counts_mu_);
    for (const auto& [code, n] : responses_) o << "afd_frontend_responses_total{code=\"" << code << "\"} " << n << '\n';
  }
  o << ffn_admin_->render_metrics();
  o << attention_admin_->render_metrics();
  if (opt_.extra_metrics) o << opt_.extra_metrics();
  return o.str();
}

void Frontend::set_metrics_targets(std::vector<MetricsTarget> targets) {
  std::lock_guard<std::mutex> l(targets_mu_);
  opt_.metrics_targets = std::move(targets);
}

std::string Frontend::scrape_metrics() const {
  if (!opt_.federate) return render_metrics();
  // The attention workers listed now, then opt_.metrics_targets.
  std::vector<MetricsTarget> targets;
  for (const auto& w : listed_workers())
    targets.push_back({w->host, w->port, "attention=\"" + std::to_string(w->index) + "\""});
  {
    std::lock_guard<std::mutex> l(targets_mu_);
    targets.insert(targets.end(), opt_.metrics_targets.begin(), opt_.metrics_targets.end());
  }
  return federate_metrics(render_metrics(), targets, opt_.health_timeout_ms, http_scrape_metrics);
}

Readiness Frontend::readiness() const {
  if (opt_.lost_workers) {
    if (std::string lost = opt_.lost_workers(); !lost.empty())
      return {false, "worker process lost for good (restart afd serve): " + lost};
  }
  const int up = workers_up();
  if (up == 0) return {false, "no attention worker is up (" + why_workers_down() + ")"};
  nlohmann::json j = {{"status", "ok"}, {"workers_up", up}, {"workers", workers_listed(*workers_->snapshot())}};
  return {true, j.dump()};
}

// FFN membership of every attention worker (serve/frontend/frontend_ffn_admin.h).
std::optional<AdminAnswer> Frontend::admin_ffn(const std::string& method, const std::string& body) {
  return ffn_admin_->request(method, body);
}

// Attention worker membership (serve/frontend/frontend_attention_admin.h) and the topology
// file reload (serve/frontend/frontend_reload.h); the API checks the key as for /v1/*.
void Frontend::extra_routes(http::Server& s) {
  auto attention = [this](const http::Request& req, http::Response& res) {
    auto [code, body] = attention_admin_->request(req.method, req.body);
    res.status = code;
    res.set_content(body, "application/json");
  };
  s.get("/admin/attention", attention);
  s.post("/admin/attention", attention);
  s.post("/admin/reload", [this](const http::Request&, http::Response& res) {
    auto [code, body] = reload("POST /admin/reload");
    res.status = code;
    res.set_content(body, "application/json");
  });
}

void Frontend::generate(GenerationCall& call, const http::Request& req, http::Response& res) {
  // The prompt tokens (parsed and tokenized as the worker would) drive placement and are
  // what every worker of this request prefills; the client's body is what is sent.
  call.meta.system_fingerprint = common_numerics(*workers_->snapshot());
  auto session = std::make_shared<ProxySession>(pool_, call.path, call.request, req.body, std::move(call.meta));
  {
    std::lock_guard<std::mutex> l(sessions_mu_);
    std::erase_if(sessions_, [](const std::weak_ptr<ProxySession>& p) { return p.expired(); });
    sessions_.push_back(session);
  }
  if (stopping_) session->cancel();
  // A client that hangs up before the answer's head cancels the request (checked every 50 ms).
  const int conn = connection_socket(req);
  ProxyAnswer a = session->open([conn] { return conn >= 0 && peer_closed(conn); });
  count_response(a.status);
  if (!a.stream) {
    res.status = a.status;
    if (!a.retry_after.empty()) res.set_header("Retry-After", a.retry_after);
    res.set_content(a.body, a.content_type);
    return;
  }
  active_.fetch_add(1);  // until the stream ends (the releaser below)
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [session](size_t, http::DataSink& sink) {
        const bool done = session->stream([&](const std::string& c) { return sink.write(c.data(), c.size()); });
        if (done) sink.done();
        return done;
      },
      [this, session](bool success) {
        if (!success) session->cancel();
        active_.fetch_sub(1);
      });
}

}  // namespace afd::serve
