// ApiServer: the OpenAI-compatible HTTP API over a GenerationBackend
// (serve/api/generation_backend.h), on the HTTP layer (serve/http/). The one place where the
// routes, their status codes, error bodies and headers are defined, for the engine server
// (LocalBackend) and the engine-less front end (Frontend) alike:
//   POST /v1/completions, /v1/chat/completions (JSON or SSE streaming)   handle_generation
//   GET  /v1/models                                                      handle_models
//   GET  /health                                                         handle_health
//   GET  /metrics                                                        handle_metrics
//   GET, POST /admin/ffn                                                 handle_admin_ffn
// plus the backend's extra_routes. With an API key, /v1/* and /admin/* require
// `Authorization: Bearer KEY` (configure_server). A generation request is checked against
// stopping/draining, parsed and tokenized here (on the admission lane), then run by the backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "serve/api/generation_backend.h"
#include "serve/api/http_common.h"
#include "serve/api/model_serving.h"

namespace afd::serve {

namespace http {
class Server;
}

class ApiServer {
 public:
  // model and backend must outlive the server. `who` names it in log lines.
  ApiServer(ServerOptions opt, const std::string& who, const ModelServing& model, GenerationBackend& backend);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the listening socket; after this, port() is the bound port.
  Status bind();
  int port() const { return port_; }
  // Serves until stop() (blocks); binds first if bind() was not called.
  Status run();
  // Thread-safe, idempotent: run() returns once the handlers in flight have finished.
  void stop();

  // The route handlers.
  void handle_health(const http::Request& req, http::Response& res);
  void handle_metrics(const http::Request& req, http::Response& res);
  void handle_admin_ffn(const http::Request& req, http::Response& res);
  void handle_models(const http::Request& req, http::Response& res);
  // POST `path` (/v1/completions or /v1/chat/completions).
  void handle_generation(Endpoint ep, const std::string& path, const http::Request& req, http::Response& res);

 private:
  void install_routes(const std::string& who);

  ServerOptions opt_;
  const ModelServing& model_;
  GenerationBackend& backend_;
  // Parses and tokenizes request bodies; declared before svr_ so that it outlives the handlers.
  std::unique_ptr<AdmissionLane> admission_;
  std::unique_ptr<http::Server> svr_;
  int port_ = -1;
  std::atomic<uint64_t> next_id_{1};  // request ids ("cmpl-<16 hex>") and default seeds
  int64_t created_ = 0;               // /v1/models "created"
};

}  // namespace afd::serve
