// ProxySession: one generation request of the front end, from placement to its last byte,
// with attention-worker failover (docs/FAILOVER.md, "Attention worker failover").
//
// The session sends the request to a worker as an internal stream (serve/api/internal_stream.h)
// and renders the client's answer itself (serve/frontend/proxy_output.h), so at every moment it knows
// the generated tokens the client has and the sampler's position after them. An attempt
// fails when the worker
//   - cannot be reached, or answers 503 (it takes no part: draining, its FFN side down);
//   - closes or resets the connection, or sends a malformed event, before the last event;
//   - sends no byte for policy.idle_timeout_s (a worker with the request sends a token or a
//     keep-alive at least every keepalive_ms(), so silence means it stopped or hangs);
//   - ends the request with a resumable error (its scheduler stopped).
// The failed worker is marked down until its /health says otherwise. A request no worker has
// accepted yet is placed on the next one not tried, and answered 503 when none is left (as
// before failover existed). A request a worker had accepted is continued on a worker that is
// up, one it has not failed on if there is such — prompt + generated tokens, same max_tokens,
// seed and sampler position — waiting up to
// policy.failover_timeout_s for one (then: 503 + Retry-After if the client has no byte yet,
// else an error event); the client sees one answer, as from an unfaulted run. Errors that
// are the request's own or the FFN side's (400, 429, a failed forward pass) end it as they
// would on an attention server.
//
// Interface without HTTP-server types: open() on the handler thread decides the answer's
// head (a complete answer, or "stream"); stream() then writes the SSE body through a
// callback. cancel() from any thread (the front end stopping).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "serve/api/internal_stream.h"
#include "serve/api/request.h"
#include "serve/api/response.h"
#include "serve/frontend/proxy_client.h"
#include "serve/frontend/proxy_output.h"
#include "serve/frontend/upstream_worker.h"
#include "serve/scheduling/router.h"
#include "serve/text/tokenizer.h"

namespace afd::serve {

struct ProxyPolicy {
  int connect_ms = 2000;
  int write_s = 30;
  // No byte from the worker for this long while it holds the request: it stalled.
  double idle_timeout_s = 15;
  // After a worker fails mid-request, how long the request may wait for another to take it over.
  double failover_timeout_s = 30;
  // A request no worker has accepted yet, with no worker left to try (none up, or every one
  // up refused it with 503): how long it waits for a worker to be up again before it is
  // answered 503 (0: at once). Placements are retried every 50 ms meanwhile.
  double wait_for_worker_s = 0;
  int retry_after_s = 1;
  // How a continuation recomputes the generated tokens (InternalControl::replay_exact): one
  // per step, bit for bit as the original did (true), or in one prefill (faster; a near tie
  // may later go another way than in an unfaulted run).
  bool exact_replay = true;
  // The keep-alive interval asked of workers: a quarter of the idle timeout, in [10, 2000] ms.
  int64_t keepalive_ms() const;
};

struct ProxyCounters {
  std::atomic<uint64_t> retries{0};    // placements repeated before any worker accepted the request
  std::atomic<uint64_t> failovers{0};  // continuations started on another worker after a failure mid-request
  std::atomic<uint64_t> stalls{0};     // exchanges given up after idle_timeout_s without a byte
  std::atomic<uint64_t> unavailable{0};  // 503s because no worker was up (or none took the request over)
  std::atomic<uint64_t> waited{0};  // requests that waited (wait_for_worker_s) for a worker to be up
};

// What every session of a front end shares; outlives them.
struct ProxyPool {
  // The attention workers by index (they may join while sessions run): a session places only
  // on placeable() ones, a continuation included.
  const WorkerRoster* workers = nullptr;
  Router* router = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ProxyPolicy policy;
  ProxyCounters* counters = nullptr;
  std::function<bool()> stopping;  // the front end stops: end every session now
  // "worker 0: <why>; ..." over the workers that are down (Frontend::why_workers_down);
  // attempts: why this request's tries failed, by worker index, preferred where not empty.
  std::function<std::string(const std::vector<std::string>* attempts)> why_down;
};

// The head of the answer to the client, and its body unless it is a stream.
struct ProxyAnswer {
  int status = 200;
  std::string content_type = "application/json";
  std::string retry_after;  // "" when none
  std::string body;
  bool stream = false;  // 200 text/event-stream: ProxySession::stream() writes the body
};

class ProxySession {
 public:
  // path: the worker path (/v1/completions, /v1/chat/completions); g: the request as the
  // front end parsed it; body: the client's body; meta: id, created, model of the answer.
  ProxySession(const ProxyPool& pool, std::string path, const GenerationRequest& g, std::string body,
               ResponseMeta meta);
  ~ProxySession();
  ProxySession(const ProxySession&) = delete;
  ProxySession& operator=(const ProxySession&) = delete;

  // Runs the request until the answer's head is known: the whole answer (non-streaming, or
  // an error before any byte), or stream = true once the first token exists. Polls
  // client_gone every 50 ms at most; a client that is gone ends the session (499).
  ProxyAnswer open(const std::function<bool()>& client_gone);
  // After open() said stream: writes the SSE body until its end (true) or until write
  // returns false (the client is gone; false). A failure after the first byte ends the
  // stream with an error event naming it.
  bool stream(const std::function<bool(const std::string&)>& write);
  // Thread-safe, idempotent: ends the session's exchange with its worker now.
  void cancel();
  // Thread-safe: if the current attempt is on worker w, ends that exchange so that the request
  // continues on another worker as after a failure there (a continuation when it was
  // accepted), except that w is not marked down and no failure of w is counted (w is leaving
  // the deployment). Whether an attempt was on w.
  bool move_off(const FrontendWorker& w);

 private:
  struct Attempt;
  enum class Kind { none, event, failed };
  struct Step {
    Kind kind = Kind::none;
    StreamEvent event;           // Kind::event
    ProxyAnswer answer;          // Kind::failed: the answer for a client without bytes yet
    std::string message;         // Kind::failed: what went wrong (for an error event)
  };
  Step advance(std::chrono::milliseconds wait);
  bool start_attempt();
  // The current attempt failed for `why` (a reason as why_workers_down lists it): leave the
  // worker, mark it down, go on elsewhere.
  void fail_attempt(const std::string& why, bool stalled);
  // After any failed attempt on w for `why`: w is not chosen again for this request while
  // another worker is up; a continuation waits with back-off, within the failover deadline.
  void after_failure(const FrontendWorker& w, const std::string& why);
  // Releases the current attempt's load (and closes its connection when cancel_call).
  void drop_attempt(bool cancel_call);
  Step failed(int status, const std::string& message, bool retry_after);
  // Sizes tried_, failed_on_, attempts_ to n workers (workers joined since the session began).
  void cover(size_t n);
  Step answer_refusal(int status, const std::string& content_type, const std::string& retry_after,
                      const std::string& body);

  const ProxyPool& pool_;
  const std::string path_, body_;
  const std::vector<int32_t> prompt_;
  const int64_t load_;  // prompt + max_tokens: what the request weighs on a worker
  const std::string name_;  // the response id, for the log
  ProxyOutput out_;
  std::vector<bool> tried_;      // workers tried before any accepted the request
  std::vector<bool> failed_on_;  // workers an attempt of this request failed on
  bool accepted_ = false;    // a worker answered 200 and began the stream
  bool retrying_ = false;    // the next placement repeats one (counted as a retry or failover)
  std::optional<std::chrono::steady_clock::time_point> failover_deadline_;
  // A request not accepted yet waiting for a worker to be up (ProxyPolicy::wait_for_worker_s).
  std::optional<std::chrono::steady_clock::time_point> wait_deadline_;
  std::chrono::steady_clock::time_point next_try_{};  // no placement before this (back-off)
  int failures_in_a_row_ = 0;
  std::vector<std::string> attempts_;  // why this request's try on each worker failed ("": none did)
  std::string pending_;  // stream bytes open() produced, for stream() to write first

  std::mutex att_mu_;  // guards att_ against cancel()
  std::shared_ptr<Attempt> att_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace afd::serve
