#include "serve/frontend.h"

#include <chrono>
#include <ctime>
#include <deque>
#include <random>
#include <sstream>

#include "core/log.h"
#include "model/config.h"
#include "runtime/topology_file.h"
#include "serve/metrics.h"
#include "serve/client_connection.h"
#include "serve/http/server.h"
#include "serve/http_common.h"
#include "serve/model_serving.h"
#include "serve/response.h"

namespace afd::serve {

// One exchange with a worker, run on its own thread so the handler can learn the status
// before answering, then forward the body as it arrives. Holds only shared state, so it may
// outlive the handler (it ends as soon as it is cancelled).
struct StreamPump {
  std::mutex mu;
  std::condition_variable cv;
  bool head_known = false;
  UpstreamHead head;
  std::deque<std::string> chunks;
  bool finished = false;
  UpstreamOutcome outcome;
  std::unique_ptr<UpstreamCall> call;
  std::atomic<bool> cancel{false};

  void stop() {
    cancel = true;
    call->cancel();
  }
};

Result<std::unique_ptr<Frontend>> Frontend::create(FrontendOptions opt) {
  if (opt.workers.empty()) return invalid_argument("front end: no attention worker addresses");
  std::unique_ptr<Frontend> f(new Frontend());
  AFD_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(opt.model_dir));
  AFD_ASSIGN_OR_RETURN(f->model_, load_model_serving(opt.model_dir, opt.model_name, opt.max_context, cfg));
  f->model_.limits.content_special_as_text = opt.server.content_special_as_text;
  for (size_t i = 0; i < opt.workers.size(); ++i) {
    auto w = std::make_shared<FrontendWorker>();
    w->index = static_cast<int>(i);
    w->address = opt.workers[i];
    if (Status s = split_host_port(w->address, &w->host, &w->port); !s.is_ok())
      return s.with_context("attention worker " + std::to_string(i));
    f->workers_.push_back(std::move(w));
  }
  auto ws = f->workers_;
  f->router_ = std::make_unique<Router>(static_cast<int>(ws.size()),
                                        [ws](int w) { return ws[w]->inflight_tokens.load(); }, 16);
  if (opt.federate) {
    for (const auto& w : f->workers_)
      f->scrape_targets_.push_back({w->host, w->port, "attention=\"" + std::to_string(w->index) + "\""});
    f->scrape_targets_.insert(f->scrape_targets_.end(), opt.metrics_targets.begin(), opt.metrics_targets.end());
  }
  f->opt_ = std::move(opt);
  f->svr_ = std::make_unique<http::Server>(http_options(f->opt_.server, "front end request handler"));
  f->created_ = static_cast<int64_t>(std::time(nullptr));
  std::random_device rd;
  f->next_id_ = (static_cast<uint64_t>(rd()) << 20) | 1;
  f->install_routes();
  return f;
}

Frontend::~Frontend() {
  stop();
  if (health_.joinable()) health_.join();
  // The exchanges were cancelled by stop(); give their threads a moment to let go.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    {
      std::lock_guard<std::mutex> l(pumps_mu_);
      std::erase_if(pumps_, [](const std::weak_ptr<StreamPump>& p) { return p.expired(); });
      if (pumps_.empty()) break;
    }
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Status Frontend::start() {
  AFD_ASSIGN_OR_RETURN(port_, bind_server(*svr_, opt_.server));
  health_ = std::thread([this] { health_loop(); });
  return Status::ok();
}

Status Frontend::run() {
  if (port_ < 0) AFD_RETURN_IF_ERROR(start());
  if (!svr_->run()) return io_error("the HTTP server is not bound");
  return Status::ok();
}

void Frontend::stop() {
  {
    std::lock_guard<std::mutex> l(health_mu_);
    stopping_ = true;
  }
  health_cv_.notify_all();
  {
    std::lock_guard<std::mutex> l(pumps_mu_);
    for (auto& wp : pumps_)
      if (auto p = wp.lock()) p->stop();
  }
  if (svr_) svr_->stop();
}

int Frontend::workers_up() const {
  int n = 0;
  for (const auto& w : workers_) n += w->up.load() ? 1 : 0;
  return n;
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

}  // namespace

std::string Frontend::why_workers_down(const std::vector<std::string>* attempts) const {
  std::string out;
  for (const auto& w : workers_) {
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
  std::vector<clock::time_point> last_wait_log(workers_.size(), clock::time_point{});
  bool announced = false;
  for (;;) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      FrontendWorker& w = *workers_[i];
      auto st = http_get(w.host, w.port, "/health", opt_.health_timeout_ms, 64 << 10);
      const std::string mismatch = st.ok() && st->status == 200 ? identity_mismatch(st->body, model_) : "";
      const bool up = st.ok() && st->status == 200 && mismatch.empty();
      const bool was = w.set_state(up, up ? "" : !mismatch.empty() ? mismatch : health_failure(st));
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
    if (!announced && workers_up() == static_cast<int>(workers_.size())) {
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
  auto labels = [](const FrontendWorker& w) {
    return "{worker=\"" + std::to_string(w.index) + "\",address=\"" + w.address + "\"}";
  };
  family("afd_frontend_worker_up", "gauge", "1 if the attention worker answered its last health check.");
  for (const auto& w : workers_) o << "afd_frontend_worker_up" << labels(*w) << ' ' << (w->up ? 1 : 0) << '\n';
  family("afd_frontend_worker_requests_total", "counter", "Requests placed on each attention worker.");
  for (const auto& w : workers_) o << "afd_frontend_worker_requests_total" << labels(*w) << ' ' << w->requests << '\n';
  family("afd_frontend_worker_failures_total", "counter",
         "Requests whose connection to the attention worker failed (refused or broken mid-response).");
  for (const auto& w : workers_) o << "afd_frontend_worker_failures_total" << labels(*w) << ' ' << w->failures << '\n';
  family("afd_frontend_worker_inflight_requests", "gauge", "Requests being proxied to each attention worker.");
  for (const auto& w : workers_)
    o << "afd_frontend_worker_inflight_requests" << labels(*w) << ' ' << w->inflight_requests << '\n';
  family("afd_frontend_worker_inflight_tokens", "gauge", "Prompt + max_tokens of the requests being proxied.");
  for (const auto& w : workers_)
    o << "afd_frontend_worker_inflight_tokens" << labels(*w) << ' ' << w->inflight_tokens << '\n';
  family("afd_frontend_retries_total", "counter", "Placements repeated on another worker after a connection failure.");
  o << "afd_frontend_retries_total " << retries_ << '\n';
  family("afd_frontend_unavailable_total", "counter", "Requests answered 503 because no attention worker was up.");
  o << "afd_frontend_unavailable_total " << no_worker_ << '\n';
  family("afd_frontend_responses_total", "counter", "Answers to /v1/* requests by HTTP status.");
  {
    std::lock_guard<std::mutex> l(counts_mu_);
    for (const auto& [code, n] : responses_) o << "afd_frontend_responses_total{code=\"" << code << "\"} " << n << '\n';
  }
  if (opt_.extra_metrics) o << opt_.extra_metrics();
  return o.str();
}

std::string Frontend::scrape_metrics() const {
  if (scrape_targets_.empty()) return render_metrics();
  return federate_metrics(render_metrics(), scrape_targets_, opt_.health_timeout_ms);
}

void Frontend::install_routes() {
  http::Server& s = *svr_;
  configure_server(s, opt_.server, "front end request handler", [this] { count_response(401); });

  s.get("/health", [this](const http::Request&, http::Response& res) {
    if (stopping_) return send_error(res, 503, "shutting down", opt_.server.retry_after_s);
    if (draining_)
      return send_error(res, 503, kDrainingHealth,
                        opt_.server.retry_after_s);
    if (opt_.lost_workers) {
      if (std::string lost = opt_.lost_workers(); !lost.empty())
        return send_error(res, 503, "worker process lost for good (restart afd serve): " + lost,
                          opt_.server.retry_after_s);
    }
    const int up = workers_up();
    if (up == 0)
      return send_error(res, 503, "no attention worker is up (" + why_workers_down() + ")", opt_.server.retry_after_s);
    nlohmann::json j = {{"status", "ok"}, {"workers_up", up}, {"workers", workers_.size()}};
    res.set_content(j.dump(), "application/json");
  });
  s.get("/metrics", [this](const http::Request&, http::Response& res) {
    res.set_content(scrape_metrics(), "text/plain; version=0.0.4");
  });
  s.get("/v1/models", [this](const http::Request&, http::Response& res) {
    nlohmann::ordered_json m = {{"object", "list"},
                                {"data", nlohmann::ordered_json::array({{{"id", model_.limits.model_name},
                                                                         {"object", "model"},
                                                                         {"created", created_},
                                                                         {"owned_by", "afd"},
                                                                         {"max_model_len", model_.limits.max_context}}})}};
    res.set_content(m.dump(), "application/json");
    count_response(200);
  });

  auto generate = [this](Endpoint ep, const std::string& path, const http::Request& req, http::Response& res) {
    const int retry_s = opt_.server.retry_after_s;
    InFlight active(active_);
    if (stopping_ || draining_) {
      count_response(503);
      return send_error(res, 503, refusal_while_closing(stopping_),
                        retry_s);
    }
    // Validate and tokenize as the worker will: 4xx answers never reach a worker, and the
    // prompt tokens drive placement.
    const ChatTemplate* chat = model_.chat ? &*model_.chat : nullptr;
    auto g = parse_request(ep, req.body, *model_.tokenizer, chat, model_.limits, next_id_.fetch_add(1));
    if (!g.ok()) {
      const int st = http_status_for(g.status());
      count_response(st);
      return send_error(res, st, g.status().message(), retry_s);
    }
    const int64_t load = static_cast<int64_t>(g->prompt.size()) + g->max_tokens;
    std::vector<bool> tried(workers_.size(), false);
    std::vector<std::string> attempts(workers_.size());  // why a tried worker did not take it
    for (size_t attempt = 0; attempt < workers_.size(); ++attempt) {
      std::vector<bool> eligible(workers_.size());
      for (size_t i = 0; i < workers_.size(); ++i) eligible[i] = !tried[i] && workers_[i]->up.load();
      const int wi = router_->place(g->prompt, eligible);
      if (wi < 0) break;
      tried[wi] = true;
      std::shared_ptr<FrontendWorker> w = workers_[wi];
      w->requests.fetch_add(1);
      w->inflight_tokens.fetch_add(load);
      w->inflight_requests.fetch_add(1);
      auto release = [w, load] {
        w->inflight_tokens.fetch_sub(load);
        w->inflight_requests.fetch_sub(1);
      };
      auto pump = std::make_shared<StreamPump>();
      pump->call = std::make_unique<UpstreamCall>(w->host, w->port, opt_.upstream);
      {
        std::lock_guard<std::mutex> pl(pumps_mu_);
        std::erase_if(pumps_, [](const std::weak_ptr<StreamPump>& p) { return p.expired(); });
        pumps_.push_back(pump);
      }
      if (stopping_) pump->stop();
      auto on_head = [pump](const UpstreamHead& h) {
        std::lock_guard<std::mutex> l(pump->mu);
        pump->head = h;
        pump->head_known = true;
        pump->cv.notify_all();
        return !pump->cancel.load();
      };
      auto on_data = [pump](const char* d, size_t n) {
        std::lock_guard<std::mutex> l(pump->mu);
        pump->chunks.emplace_back(d, n);
        pump->cv.notify_all();
        return !pump->cancel.load();
      };
      std::thread([pump, path, body = req.body, on_head, on_data, release] {
        UpstreamOutcome out = pump->call->post(path, body, on_head, on_data);
        release();
        std::lock_guard<std::mutex> l(pump->mu);
        pump->outcome = out;
        pump->finished = true;
        pump->cv.notify_all();
      }).detach();

      // Wait for the status line (or for the exchange to end without one). A non-streaming
      // answer arrives only when the whole generation is done, so meanwhile the client's
      // connection is checked every 50 ms: a client that hung up cancels the exchange, which
      // closes the upstream connection and makes the worker drop the sequence.
      std::unique_lock<std::mutex> l(pump->mu);
      const int conn = connection_socket(req);
      while (!pump->cv.wait_for(l, std::chrono::milliseconds(50), [&] { return pump->head_known || pump->finished; })) {
        if (conn >= 0 && peer_closed(conn)) {
          l.unlock();
          pump->stop();
          count_response(499);  // nginx's "client closed request"; nobody reads it
          return send_error(res, 499, "client closed the connection", retry_s);
        }
      }
      if (!pump->head_known && (stopping_ || pump->outcome.cancelled)) {
        count_response(503);
        return send_error(res, 503, "the server is shutting down", retry_s);
      }
      if (!pump->head_known) {
        // Nothing came back: the worker is unreachable; try another one.
        w->failures.fetch_add(1);
        attempts[wi] = "a request found it unreachable: " + pump->outcome.error.message();
        if (w->set_state(false, attempts[wi]))
          spdlog::warn("front end: attention worker {} at {} is down ({})", wi, w->address, pump->outcome.error.message());
        retries_.fetch_add(1);
        continue;
      }
      const UpstreamHead head = pump->head;
      const bool sse = head.status == 200 && head.content_type.find("text/event-stream") != std::string::npos;
      if (!sse) {
        while (!pump->cv.wait_for(l, std::chrono::milliseconds(50), [&] { return pump->finished; })) {
          if (conn >= 0 && peer_closed(conn)) {
            l.unlock();
            pump->stop();
            count_response(499);
            return send_error(res, 499, "client closed the connection", retry_s);
          }
        }
        std::string body;
        for (auto& c : pump->chunks) body += c;
        if (!pump->outcome.completed && stopping_) {
          count_response(503);
          return send_error(res, 503, "the server is shutting down", retry_s);
        }
        if (!pump->outcome.completed) {
          w->failures.fetch_add(1);
          count_response(502);
          return send_error(res, 502, "attention worker " + std::to_string(wi) + " failed mid-response: " +
                                          pump->outcome.error.message(), retry_s);
        }
        if (head.status == 503) {
          // The worker refused it or could not finish it (draining, shutting down, its FFN
          // worker lost or stalled) and the client has seen nothing of it yet, so another
          // worker may take it whole. Out of placement until its /health says otherwise.
          attempts[wi] = "answered a request 503: " + health_failure(HttpAnswer{head.status, body});
          if (w->set_state(false, attempts[wi])) {
            spdlog::info("front end: attention worker {} at {} refused a request (503); trying another", wi,
                         w->address);
          }
          retries_.fetch_add(1);
          continue;
        }
        count_response(head.status);
        res.status = head.status;
        if (!head.retry_after.empty()) res.set_header("Retry-After", head.retry_after);
        res.set_content(body, head.content_type.empty() ? "application/json" : head.content_type);
        return;
      }
      l.unlock();
      count_response(200);
      active_.fetch_add(1);  // until the stream ends (the releaser below)
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, pump, w, wi](size_t, http::DataSink& sink) {
            std::unique_lock<std::mutex> lk(pump->mu);
            for (;;) {
              pump->cv.wait_for(lk, std::chrono::milliseconds(200),
                                [&] { return !pump->chunks.empty() || pump->finished; });
              if (stopping_) {
                lk.unlock();
                pump->stop();
                return false;
              }
              while (!pump->chunks.empty()) {
                std::string c = std::move(pump->chunks.front());
                pump->chunks.pop_front();
                lk.unlock();
                const bool ok = sink.write(c.data(), c.size());
                if (!ok) {
                  pump->stop();  // client went away: closing upstream cancels the sequence
                  return false;
                }
                lk.lock();
              }
              if (pump->finished && pump->chunks.empty()) {
                const UpstreamOutcome out = pump->outcome;
                lk.unlock();
                if (!out.completed && !out.cancelled) {
                  w->failures.fetch_add(1);
                  const std::string e = "data: " +
                                        error_body(502, "attention worker " + std::to_string(wi) +
                                                            " failed mid-stream: " + out.error.message()) +
                                        "\n\ndata: [DONE]\n\n";
                  sink.write(e.data(), e.size());
                }
                sink.done();
                return true;
              }
            }
          },
          [this, pump](bool success) {
            if (!success) pump->stop();
            active_.fetch_sub(1);
          });
      return;
    }
    no_worker_.fetch_add(1);
    count_response(503);
    send_error(res, 503, "no attention worker is available (" + std::to_string(workers_up()) + " of " +
                             std::to_string(workers_.size()) + " up; " + why_workers_down(&attempts) + ")", retry_s);
  };
  s.post("/v1/completions", [generate](const http::Request& req, http::Response& res) {
    generate(Endpoint::completions, "/v1/completions", req, res);
  });
  s.post("/v1/chat/completions", [generate](const http::Request& req, http::Response& res) {
    generate(Endpoint::chat, "/v1/chat/completions", req, res);
  });
}

}  // namespace afd::serve
