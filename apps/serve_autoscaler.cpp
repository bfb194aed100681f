#include "serve_autoscaler.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/topology_file.h"
#include "core/log.h"
#include "serve/frontend/frontend.h"
#include "serve/frontend/proxy_client.h"
#include "serve/metrics/metrics.h"
#include "serve/metrics/prom_merge.h"

namespace afd::cli {

namespace {

using json = nlohmann::json;

// w's GET /metrics: its metrics listener, else its data address (an attention worker's).
Result<std::string> get_metrics(const ScaledWorker& w, int timeout_ms) {
  serve::MetricsTarget t = w.metrics;
  if (t.port <= 0) AFD_RETURN_IF_ERROR(split_host_port(w.address, &t.host, &t.port));
  return serve::http_scrape_metrics(t, timeout_ms);
}

// The value of `name` (with `label`) in w's scrape, or why it is missing.
Result<double> counter(const std::string& text, const ScaledWorker& w, const char* name, const char* label = "") {
  const auto v = serve::prom_sum(text, name, label);
  if (!v) return unavailable(w.name + " at " + w.address + " exports no " + name);
  return *v;
}

}  // namespace

Status check_autoscale_start(const AutoscaleSettings& s, int64_t x, int64_t y) {
  AFD_RETURN_IF_ERROR(s.controller.validate());
  if (!(s.interval_s >= 0.2 && s.interval_s <= 86400))
    return invalid_argument("--autoscale-interval-s must be in [0.2, 86400]");
  const plan::AutoscaleBounds& b = s.controller.bounds;
  if (x < b.min_attn || x > b.max_attn)
    return invalid_argument("--autoscale: the deployment starts with " + std::to_string(x) +
                            " attention workers, outside --min-attention " + std::to_string(b.min_attn) +
                            " .. --max-attention " + std::to_string(b.max_attn));
  if (y < b.min_ffn || y > b.max_ffn)
    return invalid_argument("--autoscale: the deployment starts with " + std::to_string(y) +
                            " FFN workers, outside --min-ffn " + std::to_string(b.min_ffn) + " .. --max-ffn " +
                            std::to_string(b.max_ffn));
  return Status();
}

Result<std::unique_ptr<ServeAutoscaler>> ServeAutoscaler::create(AutoscaleSettings s,
                                                                 std::vector<ScaledWorker> attention,
                                                                 std::vector<ScaledWorker> ffn,
                                                                 ChildProcesses* children, WorkerStarters start) {
  AFD_RETURN_IF_ERROR(check_autoscale_start(s, static_cast<int64_t>(attention.size()), static_cast<int64_t>(ffn.size())));
  const auto x = static_cast<int64_t>(attention.size()), y = static_cast<int64_t>(ffn.size());
  for (const ScaledWorker& w : ffn)
    if (w.metrics.port <= 0) return invalid_argument("--autoscale: " + w.name + " has no metrics listener");
  std::unique_ptr<ServeAutoscaler> a(new ServeAutoscaler());
  a->s_ = std::move(s);
  a->children_ = children;
  a->start_ = std::move(start);
  a->controller_ = std::make_unique<plan::AutoscaleController>(a->s_.controller);
  for (const ScaledWorker& w : attention) a->next_attention_index_ = std::max(a->next_attention_index_, w.index + 1);
  for (const ScaledWorker& w : ffn) a->next_ffn_index_ = std::max(a->next_ffn_index_, w.index + 1);
  a->attention_ = std::move(attention);
  a->ffn_ = std::move(ffn);
  a->last_decision_.n_attn = x;
  a->last_decision_.n_ffn = y;
  return a;
}

ServeAutoscaler::~ServeAutoscaler() { stop(); }

void ServeAutoscaler::start(serve::Frontend* frontend) {
  frontend_ = frontend;
  const plan::AutoscaleBounds& b = s_.controller.bounds;
  spdlog::info("autoscaler: every {:.1f} s, attention workers {}..{}, FFN workers {}..{}, hysteresis {:.2f}",
               s_.interval_s, b.min_attn, b.max_attn, b.min_ffn, b.max_ffn, s_.controller.hysteresis);
  thread_ = std::thread([this] { loop(); });
}

void ServeAutoscaler::stop() {
  {
    std::lock_guard<std::mutex> l(wait_mu_);
    stop_ = true;
  }
  wait_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool ServeAutoscaler::wait_ms(int64_t ms) {
  std::unique_lock<std::mutex> l(wait_mu_);
  return !wait_cv_.wait_for(l, std::chrono::milliseconds(ms), [this] { return stop_.load(); });
}

Result<plan::StageCounters> ServeAutoscaler::read_counters() const {
  std::vector<ScaledWorker> attention, ffn;
  {
    std::lock_guard<std::mutex> l(mu_);
    attention = attention_;
    ffn = ffn_;
  }
  plan::StageCounters c;
  for (const ScaledWorker& w : attention) {
    AFD_ASSIGN_OR_RETURN(std::string text, get_metrics(w, s_.scrape_timeout_ms));
    AFD_ASSIGN_OR_RETURN(double v, counter(text, w, "afd_stage_seconds_total", "stage=\"attention\""));
    c.attention_s += v;
  }
  for (const ScaledWorker& w : ffn) {
    AFD_ASSIGN_OR_RETURN(std::string text, get_metrics(w, s_.scrape_timeout_ms));
    AFD_ASSIGN_OR_RETURN(double ffn_s, counter(text, w, "afd_ffn_compute_seconds_total"));
    AFD_ASSIGN_OR_RETURN(double batches, counter(text, w, "afd_ffn_batches_total"));
    AFD_ASSIGN_OR_RETURN(double frames, counter(text, w, "afd_ffn_frames_total"));
    AFD_ASSIGN_OR_RETURN(double tokens, counter(text, w, "afd_ffn_tokens_total"));
    c.ffn_s += ffn_s;
    c.ffn_batches += batches;
    c.ffn_frames += frames;
    c.ffn_tokens += tokens;
  }
  return c;
}

void ServeAutoscaler::loop() {
  std::optional<plan::StageCounters> prev;
  const auto interval_ms = static_cast<int64_t>(s_.interval_s * 1000);
  while (wait_ms(interval_ms)) {
    auto cur = read_counters();
    if (!cur.ok()) {
      spdlog::warn("autoscaler: window skipped: {}", cur.status().to_string());
      std::lock_guard<std::mutex> l(mu_);
      ++skipped_;
      prev.reset();
      continue;
    }
    if (!prev) {
      prev = *cur;
      continue;
    }
    int64_t x = 0, y = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      x = static_cast<int64_t>(attention_.size());
      y = static_cast<int64_t>(ffn_.size());
    }
    auto w = plan::stage_window(*prev, *cur, x, y);
    prev = *cur;
    if (!w.ok()) {
      spdlog::warn("autoscaler: window skipped: {}", w.status().to_string());
      std::lock_guard<std::mutex> l(mu_);
      ++skipped_;
      continue;
    }
    auto d = controller_->decide(*w);
    if (!d.ok()) {
      spdlog::error("autoscaler: {}", d.status().to_string());
      std::lock_guard<std::mutex> l(mu_);
      ++errors_;
      continue;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      ++windows_;
      last_window_ = *w;
      last_decision_ = *d;
    }
    // An idle window is said at debug level (it recurs every interval while nothing runs).
    spdlog::log(d->r_star > 0 ? spdlog::level::info : spdlog::level::debug, "autoscaler: {}A{}F, window t_A {:.3f} ms at B {:.2f}, t_F {:.3f} ms at n {:.2f}: {}{}", x, y,
                 w->attn_time * 1e3, w->batch, w->ffn_time * 1e3, w->ffn_tokens, d->reason,
                 d->change ? " -> " + std::to_string(d->n_attn) + "A" + std::to_string(d->n_ffn) + "F" : "");
    // A change is carried out when two windows in a row ask for it: a window in which the
    // load changed mixes two regimes, and its r* is neither.
    const bool confirmed = d->change && pending_ && pending_->first == d->n_attn && pending_->second == d->n_ffn;
    if (d->change && !confirmed) {
      pending_ = std::make_pair(d->n_attn, d->n_ffn);
      spdlog::info("autoscaler: {}A{}F asked for; carried out if the next window asks for it too", d->n_attn,
                   d->n_ffn);
    }
    if (!confirmed) {
      if (!d->change) pending_.reset();
      continue;
    }
    pending_.reset();
    {
      std::lock_guard<std::mutex> l(mu_);
      changing_ = true;
    }
    Status s = apply(*d);
    std::lock_guard<std::mutex> l(mu_);
    changing_ = false;
    if (stop_) break;  // interrupted by the bundle stopping: nothing to report
    if (s.is_ok()) {
      ++changes_;
    } else {
      ++errors_;
      spdlog::error("autoscaler: the change to {}A{}F stopped at {}A{}F: {}", d->n_attn, d->n_ffn, attention_.size(),
                    ffn_.size(), s.to_string());
    }
    prev.reset();  // the window of the change is not read
  }
}

Status ServeAutoscaler::apply(const plan::AutoscaleDecision& d) {
  auto count = [this](bool attn) {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<int64_t>(attn ? attention_.size() : ffn_.size());
  };
  // FFN workers first (the controller's order), then attention workers; each step is whole.
  while (!stop_ && count(false) < d.n_ffn) AFD_RETURN_IF_ERROR(add_ffn());
  while (!stop_ && count(false) > d.n_ffn) AFD_RETURN_IF_ERROR(remove_ffn());
  while (!stop_ && count(true) < d.n_attn) AFD_RETURN_IF_ERROR(add_attention());
  while (!stop_ && count(true) > d.n_attn) AFD_RETURN_IF_ERROR(remove_attention());
  return Status();
}

std::vector<std::string> ServeAutoscaler::ffn_addresses() const {
  std::vector<std::string> out;
  for (const ScaledWorker& w : ffn_) out.push_back(w.address);
  return out;
}

void ServeAutoscaler::publish_ffn_targets() {
  std::vector<serve::MetricsTarget> t;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const ScaledWorker& w : ffn_) t.push_back(w.metrics);
  }
  frontend_->set_metrics_targets(std::move(t));
}

Status ServeAutoscaler::add_ffn() {
  int index = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    index = next_ffn_index_++;
  }
  AFD_ASSIGN_OR_RETURN(ScaledWorker w, start_.ffn(index));
  // Ready once its /metrics answers (it listens for attention workers before that).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(s_.ffn_ready_timeout_ms);
  while (!get_metrics(w, s_.scrape_timeout_ms).ok()) {
    if (std::chrono::steady_clock::now() > deadline || !wait_ms(100)) {
      (void)children_->stop(w.name);
      return unavailable(w.name + " did not come up within " + std::to_string(s_.ffn_ready_timeout_ms) + " ms");
    }
  }
  const json body = {{"add", w.address}, {"name", "ffn" + std::to_string(index)}};
  auto answer = frontend_->admin_ffn("POST", body.dump());
  if (!answer || answer->first != 200) {
    (void)children_->stop(w.name);
    return unavailable("/admin/ffn refused " + w.name + ": " + (answer ? answer->second : std::string("no answer")));
  }
  spdlog::info("autoscaler: added {} at {} (FFN members: {})", w.name, w.address, answer->second);
  {
    std::lock_guard<std::mutex> l(mu_);
    ffn_.push_back(std::move(w));
  }
  publish_ffn_targets();
  return Status();
}

Status ServeAutoscaler::remove_ffn() {
  ScaledWorker w;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (ffn_.size() <= 1) return invalid_argument("autoscaler: the last FFN worker is not removed");
    w = ffn_.back();
  }
  const json body = {{"remove", w.address}};
  auto answer = frontend_->admin_ffn("POST", body.dump());
  if (!answer || answer->first != 200)
    return unavailable("/admin/ffn refused to remove " + w.name + ": " + (answer ? answer->second : "no answer"));
  {
    std::lock_guard<std::mutex> l(mu_);
    ffn_.pop_back();
  }
  publish_ffn_targets();
  // The attention workers move off it at their next step: stop it once it has served no frame
  // for a second (or after 30 s).
  std::optional<double> last;
  for (int i = 0; i < 60 && wait_ms(500); ++i) {
    auto text = get_metrics(w, s_.scrape_timeout_ms);
    if (!text.ok()) break;
    const auto frames = serve::prom_sum(*text, "afd_ffn_frames_total");
    if (last && frames && *frames == *last && i >= 2) break;
    last = frames;
  }
  AFD_RETURN_IF_ERROR(children_->stop(w.name));
  spdlog::info("autoscaler: removed {} at {}", w.name, w.address);
  return Status();
}

Status ServeAutoscaler::add_attention() {
  int index = 0;
  std::vector<std::string> ffn;
  {
    std::lock_guard<std::mutex> l(mu_);
    index = next_attention_index_++;
    ffn = ffn_addresses();
  }
  AFD_ASSIGN_OR_RETURN(ScaledWorker w, start_.attention(index, ffn));
  auto [code, body] = frontend_->attention_admin().add(w.address, "autoscaler");
  if (code != 200) {
    (void)children_->stop(w.name);
    return unavailable("/admin/attention refused " + w.name + ": " + body);
  }
  spdlog::info("autoscaler: added {} at {}: placed on once its /health passes", w.name, w.address);
  std::lock_guard<std::mutex> l(mu_);
  attention_.push_back(std::move(w));
  return Status();
}

Status ServeAutoscaler::remove_attention() {
  ScaledWorker w;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (attention_.size() <= 1) return invalid_argument("autoscaler: the last attention worker is not removed");
    w = attention_.back();
  }
  auto [code, body] = frontend_->attention_admin().remove(w.address, "autoscaler");
  if (code != 200) return unavailable("/admin/attention refused to remove " + w.name + ": " + body);
  {
    std::lock_guard<std::mutex> l(mu_);
    attention_.pop_back();
  }
  // Draining: its requests finish there; stop it once the front end has removed it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(s_.drain_timeout_ms);
  for (;;) {
    auto [gc, listing] = frontend_->attention_admin().request("GET", "");
    const json j = json::parse(listing, nullptr, false);
    bool listed = false;
    if (gc == 200 && j.is_object() && j.contains("workers") && j["workers"].is_array())
      for (const auto& e : j["workers"])
        listed = listed || (e.is_object() && e.value("address", std::string()) == w.address);
    if (!listed) break;
    if (std::chrono::steady_clock::now() > deadline || !wait_ms(200)) {
      spdlog::warn("autoscaler: {} still draining after {} ms: stopping it (its requests continue elsewhere)",
                   w.name, s_.drain_timeout_ms);
      break;
    }
  }
  AFD_RETURN_IF_ERROR(children_->stop(w.name));
  spdlog::info("autoscaler: removed {} at {}", w.name, w.address);
  return Status();
}

std::string ServeAutoscaler::render_metrics() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string o;
  const plan::AutoscaleBounds& b = s_.controller.bounds;
  serve::prom_header(&o, "afd_autoscale_workers", "gauge", "Workers the autoscaler runs, by role.");
  o += "afd_autoscale_workers{role=\"attention\"} " + std::to_string(attention_.size()) + "\n";
  o += "afd_autoscale_workers{role=\"ffn\"} " + std::to_string(ffn_.size()) + "\n";
  serve::prom_header(&o, "afd_autoscale_bounds", "gauge", "The autoscaler's worker bounds (--min/--max-*).");
  o += "afd_autoscale_bounds{role=\"attention\",bound=\"min\"} " + std::to_string(b.min_attn) + "\n";
  o += "afd_autoscale_bounds{role=\"attention\",bound=\"max\"} " + std::to_string(b.max_attn) + "\n";
  o += "afd_autoscale_bounds{role=\"ffn\",bound=\"min\"} " + std::to_string(b.min_ffn) + "\n";
  o += "afd_autoscale_bounds{role=\"ffn\",bound=\"max\"} " + std::to_string(b.max_ffn) + "\n";
  serve::prom_header(&o, "afd_autoscale_windows_total", "counter", "Windows read and decided on.");
  o += "afd_autoscale_windows_total " + std::to_string(windows_) + "\n";
  serve::prom_header(&o, "afd_autoscale_windows_skipped_total", "counter",
                     "Windows not decided on (a worker could not be read, or restarted).");
  o += "afd_autoscale_windows_skipped_total " + std::to_string(skipped_) + "\n";
  serve::prom_header(&o, "afd_autoscale_changes_total", "counter", "Decisions that changed the worker counts.");
  o += "afd_autoscale_changes_total " + std::to_string(changes_) + "\n";
  serve::prom_header(&o, "afd_autoscale_changing", "gauge",
                     "1 while a change is being carried out (workers starting, draining or stopping).");
  o += std::string("afd_autoscale_changing ") + (changing_ ? "1" : "0") + "\n";
  serve::prom_header(&o, "afd_autoscale_errors_total", "counter",
                     "Decisions that could not be made or carried out in full (logged).");
  o += "afd_autoscale_errors_total " + std::to_string(errors_) + "\n";
  serve::prom_header(&o, "afd_autoscale_ratio", "gauge", "r = attention / FFN workers of the last window.");
  o += "afd_autoscale_ratio " + serve::prom_num(last_decision_.ratio) + "\n";
  serve::prom_header(&o, "afd_autoscale_r_star", "gauge",
                     "The ratio theory's optimum r* for the last window's load (0: not read).");
  o += "afd_autoscale_r_star " + serve::prom_num(last_decision_.r_star) + "\n";
  serve::prom_header(&o, "afd_autoscale_stage_seconds", "gauge",
                     "The last window's attention time per micro-batch and layer, and FFN time per batch.");
  o += "afd_autoscale_stage_seconds{stage=\"attention\"} " + serve::prom_num(last_window_.attn_time) + "\n";
  o += "afd_autoscale_stage_seconds{stage=\"ffn\"} " + serve::prom_num(last_window_.ffn_time) + "\n";
  serve::prom_header(&o, "afd_autoscale_tokens", "gauge",
                     "The last window's tokens per attention micro-batch (B) and per FFN batch and worker (n).");
  o += "afd_autoscale_tokens{side=\"attention\"} " + serve::prom_num(last_window_.batch) + "\n";
  o += "afd_autoscale_tokens{side=\"ffn\"} " + serve::prom_num(last_window_.ffn_tokens) + "\n";
  serve::prom_header(&o, "afd_autoscale_ffn_fit", "gauge", "The fit t_F = alpha n + beta the last decision used.");
  o += "afd_autoscale_ffn_fit{term=\"alpha\"} " + serve::prom_num(last_decision_.ffn_alpha) + "\n";
  o += "afd_autoscale_ffn_fit{term=\"beta\"} " + serve::prom_num(last_decision_.ffn_beta) + "\n";
  return o;
}

}  // namespace afd::cli
