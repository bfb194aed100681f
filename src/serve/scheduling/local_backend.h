// LocalBackend: the GenerationBackend (serve/api/generation_backend.h) of an engine server:
// each request is placed by the Router on one of this process's Schedulers and waits on its
// RequestChannel while the scheduler's thread produces tokens. A request carrying
// kInternalStreamHeader is a front end's internal stream (serve/api/internal_stream.h), possibly
// resuming a sequence another worker started (serve/scheduling/worker_resume.h). /health reports the
// engines' readiness (an AFD attention worker's FFN connection) and this server's identity
// (attention_health_body); /admin/ffn is the FFN membership handler set by set_ffn_admin.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "serve/api/generation_backend.h"
#include "serve/api/model_serving.h"
#include "serve/metrics/metrics.h"
#include "serve/scheduling/router.h"
#include "serve/scheduling/scheduler.h"

namespace afd::serve {

// The /health body of a ready attention server: {"status":"ok","role":"attention",
// "model":NAME,"model_config":config_fingerprint_hex(m),"system_fingerprint":..,
// "deterministic":bool,"instance":instance}. The instance
// (16 hex digits drawn when the server starts) tells a front end that a worker at the same
// address is another process than before (it restarted), so state the front end gave the old
// one (the FFN membership set through its /admin/ffn) must be given again.
std::string attention_health_body(const ModelServing& m, const std::string& instance);

// An administrative route's handler: (method, body) -> (HTTP status, JSON body).
using AdminFn = std::function<AdminAnswer(const std::string& method, const std::string& body)>;

class LocalBackend final : public GenerationBackend {
 public:
  // model, workers, router and metrics must outlive the backend; retry_after_s is the
  // Retry-After of its own 429 / 503 answers.
  LocalBackend(const ModelServing& model, std::vector<Scheduler*> workers, Router* router, Metrics* metrics,
               int retry_after_s);

  // From now on stopping(): streams still open end at their next wait.
  void stop() { stopping_ = true; }
  // Graceful shutdown, first half: from now on new generation requests and /health answer
  // 503 ("draining"); requests already accepted run to the end. Thread-safe.
  void drain() { draining_ = true; }
  // After drain(): true once no handler is between its draining check and handing its
  // request to a scheduler, and every scheduler is idle, i.e. every accepted request has
  // produced its last event. Thread-safe.
  bool drained() const;
  // GET/POST /admin/ffn (serve/scheduling/ffn_admin.h); 404 while unset. Set before the server runs.
  void set_ffn_admin(AdminFn fn) { ffn_admin_ = std::move(fn); }

  // GenerationBackend
  bool stopping() const override { return stopping_.load(); }
  bool draining() const override { return draining_.load(); }
  std::atomic<int>& in_flight() override { return admitting_; }
  void count_response(int status) override { metrics_->request_finished(status); }
  Readiness readiness() const override;
  std::string metrics_text() const override {
    return metrics_->render() + render_numerics_info(model_.system_fingerprint, model_.deterministic);
  }
  std::optional<AdminAnswer> admin_ffn(const std::string& method, const std::string& body) override;
  bool serves_internal_streams() const override { return true; }
  void generate(GenerationCall& call, const http::Request& req, http::Response& res) override;

 private:
  // The three ways an accepted request is answered.
  void answer_internal_stream(const std::shared_ptr<RequestChannel>& ch, int64_t keepalive_ms, http::Response& res);
  void answer_whole(const GenerationCall& call, const std::shared_ptr<RequestChannel>& ch, const http::Request& req,
                    http::Response& res);
  void answer_stream(const GenerationCall& call, const std::shared_ptr<RequestChannel>& ch, http::Response& res);

  const ModelServing& model_;
  std::vector<Scheduler*> workers_;
  Router* router_;
  Metrics* metrics_;
  int retry_after_s_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int> admitting_{0};  // handlers past the draining check, before submit() returned
  std::string instance_;           // /health "instance"
  AdminFn ffn_admin_;
};

}  // namespace afd::serve
