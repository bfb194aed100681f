// HttpServer: the OpenAI-compatible HTTP API (on the HTTP layer, serve/http/).
//   POST /v1/completions, /v1/chat/completions (JSON or SSE streaming)
//   GET  /v1/models, /health, /metrics
//   GET, POST /admin/ffn (AFD attention workers: the FFN membership, set_ffn_admin)
// Binds 127.0.0.1 unless told otherwise; an optional API key is checked (constant time)
// on /v1/*. Handlers run on the HTTP layer's handler pool; each generation request waits on its
// RequestChannel while a Scheduler thread produces tokens.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/chat_template.h"
#include "serve/http_common.h"
#include "serve/metrics.h"
#include "serve/request.h"
#include "serve/router.h"
#include "serve/scheduler.h"
#include "serve/tokenizer.h"

namespace afd::serve {

namespace http {
class Server;
}

// Everything the handlers need to know about the served model.
struct ModelServing {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat;  // absent: chat endpoint answers 400
  std::vector<int32_t> eos_ids;
  RequestLimits limits;              // model_name, vocab_size, max_context
  // model_config_fingerprint() of the model: an attention server's /health reports it, and
  // a front end only places requests on workers whose fingerprint equals its own.
  uint64_t config_fingerprint = 0;
};

// m.config_fingerprint as /health reports it: 16 lowercase hex digits.
std::string config_fingerprint_hex(const ModelServing& m);
// The /health body of a ready attention server: {"status":"ok","role":"attention",
// "model":NAME,"model_config":config_fingerprint_hex(m),"instance":instance}. The instance
// (16 hex digits drawn when the server starts) tells a front end that a worker at the same
// address is another process than before (it restarted), so state the front end gave the old
// one (the FFN membership set through its /admin/ffn) must be given again.
std::string attention_health_body(const ModelServing& m, const std::string& instance);

// An administrative route's handler: (method, body) -> (HTTP status, JSON body).
using AdminFn = std::function<std::pair<int, std::string>(const std::string& method, const std::string& body)>;

class HttpServer {
 public:
  // workers, router and metrics must outlive the server.
  HttpServer(ServerOptions opt, ModelServing model, std::vector<Scheduler*> workers, Router* router, Metrics* metrics);
  ~HttpServer();
  // Binds the listening socket; after this, port() is the bound port.
  Status bind();
  int port() const { return port_; }
  // Serves until stop() (blocks).
  Status run();
  void stop();
  // Graceful shutdown, first half: from now on new generation requests and /health answer
  // 503 ("draining"); requests already accepted run to the end. Thread-safe.
  void drain();
  // After drain(): true once no handler is between its draining check and handing its
  // request to a scheduler, and every scheduler is idle, i.e. every accepted request has
  // produced its last event. Thread-safe.
  bool drained() const;
  // GET/POST /admin/ffn (serve/ffn_admin.h), checked against the API key as /v1/* is (every
  // /admin/ path is, configure_server); 404
  // while unset. Set before run().
  void set_ffn_admin(AdminFn fn) { ffn_admin_ = std::move(fn); }

 private:
  void install_routes();

  ServerOptions opt_;
  ModelServing model_;
  std::vector<Scheduler*> workers_;
  Router* router_;
  Metrics* metrics_;
  // Parses and tokenizes request bodies; declared before svr_ so that it outlives the handlers.
  std::unique_ptr<AdmissionLane> admission_;
  std::unique_ptr<http::Server> svr_;
  int port_ = -1;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int> admitting_{0};  // handlers past the draining check, before submit() returned
  int64_t created_ = 0;
  std::string instance_;  // /health "instance"
  AdminFn ffn_admin_;
};

}  // namespace afd::serve
