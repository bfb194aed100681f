// GenerationBackend: what the OpenAI-compatible HTTP API (serve/api/api_server.h) needs from
// whatever produces the tokens. Two implementations:
//   LocalBackend (serve/scheduling/local_backend.h): this process's schedulers and engines;
//   Frontend     (serve/frontend/frontend.h): attention worker processes, through the Router and a
//                ProxySession per request.
// The API owns every route, status code, error body and header that both share; a backend
// answers only what differs between them (readiness, metrics text, /admin/ffn, how a parsed
// request is run) and may add routes of its own (extra_routes).
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <utility>

#include "serve/api/http_common.h"
#include "serve/api/internal_stream.h"
#include "serve/api/request.h"
#include "serve/api/response.h"
#include "serve/http/message.h"

namespace afd::serve {

namespace http {
class Server;
}

// GET /health when the server is neither stopping nor draining: ready answers 200 with `text`
// as its JSON body; not ready answers 503 + Retry-After with `text` as the error message.
struct Readiness {
  bool ready = false;
  std::string text;
};

// An administrative answer: HTTP status and JSON body.
using AdminAnswer = std::pair<int, std::string>;

// One generation request, validated and tokenized by the API, handed to the backend.
struct GenerationCall {
  Endpoint endpoint = Endpoint::completions;
  std::string path;             // "/v1/completions" or "/v1/chat/completions"
  GenerationRequest request;
  ResponseMeta meta;            // id, model, created, endpoint, logprobs
  // A front end's internal stream (serve/api/internal_stream.h; only where
  // serves_internal_streams()): the control line; the request was parsed from its client body.
  const InternalBody* internal = nullptr;
  // The handler's count on in_flight(): the backend may release() it once the request is
  // handed on (e.g. queued in a scheduler); it is released when the handler returns otherwise.
  InFlight* in_flight = nullptr;
};

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;

  // stop() / drain() have been called: new generation requests and /health answer 503.
  virtual bool stopping() const = 0;
  virtual bool draining() const = 0;
  // Raised by every generation handler before it reads draining() (InFlight), so a backend's
  // drained() can wait for requests that passed the check and are not handed on yet.
  virtual std::atomic<int>& in_flight() = 0;
  // Counts one answer to a /v1/* request by HTTP status (401s of the API-key check included).
  virtual void count_response(int status) = 0;

  // GET /health past the stopping/draining checks.
  virtual Readiness readiness() const = 0;
  // GET /metrics: Prometheus text exposition.
  virtual std::string metrics_text() const = 0;
  // GET/POST /admin/ffn (method, body); nullopt: there is no FFN membership here (404).
  virtual std::optional<AdminAnswer> admin_ffn(const std::string& method, const std::string& body) = 0;
  // Whether a request carrying kInternalStreamHeader is a front end's internal stream (an
  // attention server) or an ordinary request whose header is ignored (a front end).
  virtual bool serves_internal_streams() const = 0;
  // Runs the request and fills `res`: the whole answer, an error, or an SSE stream (a chunked
  // content provider). A client that disconnects cancels the request.
  virtual void generate(GenerationCall& call, const http::Request& req, http::Response& res) = 0;
  // Routes of this backend only, installed after the API's (the API-key check covers them
  // under /v1/ and /admin/).
  virtual void extra_routes(http::Server&) {}
};

}  // namespace afd::serve
