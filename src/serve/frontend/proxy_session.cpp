#include "serve/frontend/proxy_session.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "serve/frontend/sse_reader.h"

namespace afd::serve {
namespace {

using clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBody = 1 << 20;  // a worker's non-stream answer (an error) kept for the client

// Why a worker refused: the non-empty message of its OpenAI-style error body, else its status.
std::string refusal_reason(int status, const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty()) {
    std::string why = j["error"]["message"].get<std::string>();
    if (why.size() > 300) why = why.substr(0, 300) + "...";  // it goes into our own answers
    return why;
  }
  return "answered " + std::to_string(status) + " without a reason";
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g s", s);
  return b;
}

}  // namespace

int64_t ProxyPolicy::keepalive_ms() const {
  return std::clamp<int64_t>(static_cast<int64_t>(idle_timeout_s * 1000 / 4), 10, 2000);
}

// One exchange with one worker. Shared with the thread that runs it, so it may outlive the
// session (the thread ends soon after cancel()).
struct ProxySession::Attempt {
  std::shared_ptr<FrontendWorker> w;
  std::unique_ptr<UpstreamCall> call;
  int64_t load = 0;
  int64_t resumed_after = 0;  // generated tokens the control line carried
  std::atomic<bool> moved{false};  // move_off() ended it: the worker leaves, it did not fail

  std::mutex mu;
  std::condition_variable cv;
  bool head_known = false;
  bool head_seen = false;  // session side: the head was looked at
  UpstreamHead head;
  bool sse = false;
  SseReader reader;
  std::deque<SseEvent> events;
  std::string body;    // a non-stream answer (an error), up to kMaxErrorBody
  Status framing;      // the SSE framing broke
  bool finished = false;
  UpstreamOutcome outcome;
  clock::time_point last_byte = clock::now();
};

ProxySession::ProxySession(const ProxyPool& pool, std::string path, const GenerationRequest& g, std::string body,
                           ResponseMeta meta)
    : pool_(pool),
      path_(std::move(path)),
      body_(std::move(body)),
      prompt_(g.prompt),
      load_(static_cast<int64_t>(g.prompt.size()) + g.max_tokens),
      name_(meta.id),
      out_(std::move(meta), pool.tokenizer, g),
      tried_(pool.workers->snapshot()->size(), false),
      failed_on_(tried_.size(), false),
      attempts_(tried_.size()) {}

void ProxySession::cover(size_t n) {
  if (tried_.size() >= n) return;
  tried_.resize(n, false);
  failed_on_.resize(n, false);
  attempts_.resize(n);
}

ProxySession::~ProxySession() {
  cancel();
  drop_attempt(true);
}

void ProxySession::cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> l(att_mu_);
  if (att_) att_->call->cancel();
}

bool ProxySession::move_off(const FrontendWorker& w) {
  std::lock_guard<std::mutex> l(att_mu_);
  if (!att_ || att_->w.get() != &w) return false;
  att_->moved = true;
  att_->call->cancel();
  return true;
}

void ProxySession::drop_attempt(bool cancel_call) {
  std::shared_ptr<Attempt> a;
  {
    std::lock_guard<std::mutex> l(att_mu_);
    a.swap(att_);
  }
  if (!a) return;
  if (cancel_call) a->call->cancel();
  a->w->inflight_tokens.fetch_sub(a->load);
  a->w->inflight_requests.fetch_sub(1);
}

bool ProxySession::start_attempt() {
  const auto now = clock::now();
  if (now < next_try_) return false;
  // Not yet accepted: each worker once. A continuation: the workers it has not failed on,
  // else any that is up (e.g. the failed one, restarted).
  const auto ws = pool_.workers->snapshot();
  cover(ws->size());
  std::vector<bool> eligible(ws->size());
  bool any = false;
  for (size_t i = 0; i < eligible.size(); ++i) {
    eligible[i] = (*ws)[i]->placeable() && (accepted_ ? !failed_on_[i] : !tried_[i]);
    any = any || eligible[i];
  }
  // A continuation, or a new request waiting for a worker (wait_deadline_): any worker up
  // again (e.g. one that refused it while its FFN worker was lost, and is back).
  if ((accepted_ || wait_deadline_) && !any)
    for (size_t i = 0; i < eligible.size(); ++i) eligible[i] = (*ws)[i]->placeable();
  const int wi = pool_.router->place(prompt_, eligible);
  if (wi < 0) return false;
  tried_[wi] = true;
  auto a = std::make_shared<Attempt>();
  a->w = (*ws)[wi];
  a->load = load_;
  a->resumed_after = out_.n_generated();
  UpstreamTimeouts t;
  t.connect_ms = pool_.policy.connect_ms;
  t.write_s = pool_.policy.write_s;
  // A backstop only: the session gives up after idle_timeout_s itself.
  t.read_s = static_cast<int>(std::ceil(pool_.policy.idle_timeout_s)) + 5;
  a->call = std::make_unique<UpstreamCall>(a->w->host, a->w->port, t);
  a->w->requests.fetch_add(1);
  a->w->inflight_tokens.fetch_add(load_);
  a->w->inflight_requests.fetch_add(1);
  if (retrying_) {
    (accepted_ ? pool_.counters->failovers : pool_.counters->retries).fetch_add(1);
    if (accepted_)
      spdlog::info("front end: {} continues on attention worker {} at {} after {} generated tokens", name_, wi,
                   a->w->address, out_.n_generated());
  }
  retrying_ = false;
  {
    std::lock_guard<std::mutex> l(att_mu_);
    att_ = a;
    if (cancelled_) a->call->cancel();
  }
  std::string body = encode_control(out_.control(pool_.policy.keepalive_ms(), pool_.policy.exact_replay)) + "\n" + body_;
  std::thread([a, path = path_, body = std::move(body)] {
    auto on_head = [a](const UpstreamHead& h) {
      std::lock_guard<std::mutex> l(a->mu);
      a->head = h;
      a->head_known = true;
      a->sse = h.status == 200 && h.content_type.find("text/event-stream") != std::string::npos;
      a->last_byte = clock::now();
      a->cv.notify_all();
      return true;
    };
    auto on_data = [a](const char* d, size_t n) {
      std::lock_guard<std::mutex> l(a->mu);
      a->last_byte = clock::now();
      if (!a->sse) {
        if (a->body.size() < kMaxErrorBody) a->body.append(d, std::min(n, kMaxErrorBody - a->body.size()));
        return true;
      }
      std::vector<SseEvent> evs;
      Status s = a->reader.feed(std::string_view(d, n), &evs);
      for (SseEvent& e : evs) a->events.push_back(std::move(e));
      if (!s.is_ok()) a->framing = s;
      a->cv.notify_all();
      return s.is_ok();
    };
    UpstreamOutcome out = a->call->post(path, body, on_head, on_data, {{kInternalStreamHeader, "1"}});
    std::lock_guard<std::mutex> l(a->mu);
    a->outcome = std::move(out);
    a->finished = true;
    a->cv.notify_all();
  }).detach();
  return true;
}

void ProxySession::fail_attempt(const std::string& why, bool stalled) {
  std::shared_ptr<Attempt> a;
  {
    std::lock_guard<std::mutex> l(att_mu_);
    a = att_;
  }
  if (!a) return;
  FrontendWorker& w = *a->w;
  if (a->moved.load()) {
    spdlog::info(
        "front end: {}: attention worker {} at {} is leaving: moving the request elsewhere after {} generated "
        "tokens",
        name_, w.index, w.address, out_.n_generated());
    after_failure(w, "left the deployment (removed through /admin/attention with migrate)");
    drop_attempt(true);
    return;
  }
  w.failures.fetch_add(1);
  if (stalled) pool_.counters->stalls.fetch_add(1);
  w.set_state(false, why);
  if (accepted_)
    spdlog::warn("front end: {}: attention worker {} at {}: {}; continuing it elsewhere after {} generated tokens", name_,
                 w.index, w.address, why, out_.n_generated());
  else
    spdlog::warn("front end: {}: attention worker {} at {}: {}; trying another worker", name_, w.index, w.address, why);
  after_failure(w, why);
  drop_attempt(true);
}

void ProxySession::after_failure(const FrontendWorker& w, const std::string& why) {
  cover(static_cast<size_t>(w.index) + 1);
  failed_on_[static_cast<size_t>(w.index)] = true;
  attempts_[static_cast<size_t>(w.index)] = why;
  if (accepted_) {
    if (!failover_deadline_)
      failover_deadline_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                              std::chrono::duration<double>(pool_.policy.failover_timeout_s));
    // Back off between continuations that keep failing (50 ms, doubling to 1 s).
    next_try_ = clock::now() + std::chrono::milliseconds(std::min(1000, 50 << std::min(failures_in_a_row_, 5)));
  }
  ++failures_in_a_row_;
  retrying_ = true;
}

ProxySession::Step ProxySession::failed(int status, const std::string& message, bool retry_after) {
  drop_attempt(true);
  Step s;
  s.kind = Kind::failed;
  s.message = message;
  s.answer.status = status;
  s.answer.body = error_body(status, message);
  if (retry_after) s.answer.retry_after = std::to_string(pool_.policy.retry_after_s);
  return s;
}

// The worker answered something other than the internal stream (an error, before it took
// any part in the request).
ProxySession::Step ProxySession::answer_refusal(int status, const std::string& content_type,
                                                const std::string& retry_after, const std::string& body) {
  const std::string reason = refusal_reason(status, body);
  std::shared_ptr<Attempt> a;
  {
    std::lock_guard<std::mutex> l(att_mu_);
    a = att_;
  }
  if (a && (status == 503 || (status == 429 && accepted_))) {
    // It refused (draining, shutting down, its FFN worker lost or stalled; or, for a
    // continuation, a full queue): another worker may take the request whole.
    FrontendWorker& w = *a->w;
    const std::string why = "answered a request " + std::to_string(status) + ": " + reason;
    if (status == 503 && w.set_state(false, why))
      spdlog::info("front end: attention worker {} at {} refused a request (503); trying another", w.index,
                   w.address);
    after_failure(w, why);
    drop_attempt(false);
    return {};
  }
  if (!accepted_) {
    // The request's own answer (e.g. 429: that worker's queue is full): passed on as it is.
    drop_attempt(false);
    Step s;
    s.kind = Kind::failed;
    s.message = reason;
    s.answer.status = status;
    s.answer.content_type = content_type.empty() ? "application/json" : content_type;
    s.answer.retry_after = retry_after;
    s.answer.body = body;
    return s;
  }
  return failed(status, "attention worker refused the continuation of this request: " + reason, false);
}

ProxySession::Step ProxySession::advance(std::chrono::milliseconds wait) {
  if (cancelled_ || (pool_.stopping && pool_.stopping())) return failed(503, "the server is shutting down", true);
  if (!att_) {
    if (accepted_ && failover_deadline_ && clock::now() >= *failover_deadline_) {
      pool_.counters->unavailable.fetch_add(1);
      return failed(503,
                    "no attention worker took the request over within " + seconds(pool_.policy.failover_timeout_s) +
                        " (" + pool_.why_down(&attempts_) + ")",
                    true);
    }
    if (!start_attempt()) {
      if (!accepted_ && pool_.policy.wait_for_worker_s > 0) {
        if (!wait_deadline_) {
          wait_deadline_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                              std::chrono::duration<double>(pool_.policy.wait_for_worker_s));
          pool_.counters->waited.fetch_add(1);
        }
        if (clock::now() < *wait_deadline_) {
          std::this_thread::sleep_for(std::min(wait, std::chrono::milliseconds(50)));
          return {};
        }
      }
      if (!accepted_) {
        pool_.counters->unavailable.fetch_add(1);
        const auto ws = pool_.workers->snapshot();
        const int up = workers_up(*ws);
        return failed(503,
                      "no attention worker is available" +
                          (wait_deadline_ ? " within " + seconds(pool_.policy.wait_for_worker_s) : std::string()) +
                          " (" + std::to_string(up) + " of " + std::to_string(workers_listed(*ws)) + " up; " +
                          pool_.why_down(&attempts_) + ")",
                      true);
      }
      std::this_thread::sleep_for(std::min(wait, std::chrono::milliseconds(50)));
      return {};
    }
  }
  std::shared_ptr<Attempt> a = att_;
  std::unique_lock<std::mutex> l(a->mu);
  a->cv.wait_for(l, wait, [&] {
    return !a->events.empty() || a->finished || (a->head_known && !a->head_seen) || !a->framing.is_ok();
  });
  if (a->head_known && !a->head_seen) {
    a->head_seen = true;
    if (a->sse) accepted_ = true;
  }
  if (a->head_known && !a->sse) {
    if (a->finished && a->outcome.completed) {
      const UpstreamHead h = a->head;
      const std::string body = std::move(a->body);
      l.unlock();
      return answer_refusal(h.status, h.content_type, h.retry_after, body);
    }
    // finished but cut short: handled below as a broken exchange
  }
  while (a->sse && !a->events.empty()) {
    SseEvent ev = std::move(a->events.front());
    a->events.pop_front();
    if (!ev.has_data) continue;  // keep-alive
    auto d = decode_event(ev.data);
    if (!d.ok()) {
      l.unlock();
      fail_attempt("sent a request a malformed event (" + d.status().message() + ")", false);
      return {};
    }
    if (d->event.finish == FinishReason::cancelled) {
      l.unlock();
      fail_attempt("stopped with a request unfinished (" + d->event.error.message() + ")", false);
      return {};
    }
    if (d->event.finish == FinishReason::error) {
      l.unlock();
      return failed(d->http_status, d->event.error.message(), d->http_status == 429 || d->http_status == 503);
    }
    failures_in_a_row_ = 0;
    failover_deadline_.reset();
    Step s;
    s.kind = Kind::event;
    s.event = std::move(d->event);
    if (s.event.finish != FinishReason::none) {
      l.unlock();
      drop_attempt(false);  // its stream ends by itself
    }
    return s;
  }
  if (!a->framing.is_ok()) {
    const std::string m = a->framing.message();
    l.unlock();
    fail_attempt("broke a request's event stream (" + m + ")", false);
    return {};
  }
  if (a->finished) {
    const UpstreamOutcome o = a->outcome;
    l.unlock();
    const std::string how = o.completed ? "the response ended" : o.error.message();
    fail_attempt((o.responded ? "ended a request's stream before its end: " : "a request found it unreachable: ") + how,
                 false);
    return {};
  }
  const double silent = std::chrono::duration<double>(clock::now() - a->last_byte).count();
  if (silent >= pool_.policy.idle_timeout_s) {
    l.unlock();
    fail_attempt("sent a request nothing for " + seconds(silent) + " (--upstream-idle-timeout-s " +
                     seconds(pool_.policy.idle_timeout_s) + ")",
                 true);
  }
  return {};
}

ProxyAnswer ProxySession::open(const std::function<bool()>& client_gone) {
  auto next_check = clock::now();
  for (;;) {
    Step s = advance(std::chrono::milliseconds(50));
    if (s.kind == Kind::failed) return s.answer;
    if (s.kind == Kind::event) {
      std::string bytes = out_.add(s.event);
      ProxyAnswer a;
      if (!bytes.empty()) {
        pending_ = std::move(bytes);
        a.stream = true;
        a.content_type = "text/event-stream";
        return a;
      }
      if (out_.finished()) {
        a.body = out_.body();
        return a;
      }
    }
    if (clock::now() >= next_check) {
      next_check = clock::now() + std::chrono::milliseconds(50);
      if (client_gone && client_gone()) {
        cancel();
        drop_attempt(true);
        ProxyAnswer a;
        a.status = 499;  // nginx's "client closed request"; nobody reads it
        a.body = error_body(499, "client closed the connection");
        return a;
      }
    }
  }
}

bool ProxySession::stream(const std::function<bool(const std::string&)>& write) {
  if (!pending_.empty()) {
    const bool ok = write(pending_);
    pending_.clear();
    if (!ok) {
      cancel();
      return false;
    }
  }
  while (!out_.finished()) {
    Step s = advance(std::chrono::milliseconds(200));
    if (s.kind == Kind::failed) {
      write(ProxyOutput::stream_error(s.answer.status, s.message));
      return true;
    }
    if (s.kind != Kind::event) continue;
    const std::string bytes = out_.add(s.event);
    if (!bytes.empty() && !write(bytes)) {
      cancel();  // the client went away: closing the upstream connection cancels the sequence
      return false;
    }
  }
  return true;
}

}  // namespace afd::serve
