#include "serve/api/api_server.h"

#include <cstdio>
#include <ctime>
#include <optional>
#include <random>

#include "serve/api/internal_request.h"
#include "serve/http/server.h"

namespace afd::serve {

ApiServer::ApiServer(ServerOptions opt, const std::string& who, const ModelServing& model, GenerationBackend& backend)
    : opt_(std::move(opt)),
      model_(model),
      backend_(backend),
      admission_(std::make_unique<AdmissionLane>(opt_.admission)),
      svr_(std::make_unique<http::Server>(http_options(opt_, who))) {
  created_ = static_cast<int64_t>(std::time(nullptr));
  std::random_device rd;
  next_id_ = (static_cast<uint64_t>(rd()) << 20) | 1;
  install_routes(who);
}

ApiServer::~ApiServer() { stop(); }

Status ApiServer::bind() {
  AFD_ASSIGN_OR_RETURN(port_, bind_server(*svr_, opt_));
  return Status();
}

Status ApiServer::run() {
  if (port_ < 0) AFD_RETURN_IF_ERROR(bind());
  if (!svr_->run()) return io_error("the HTTP server is not bound");
  return Status();
}

void ApiServer::stop() {
  if (svr_) svr_->stop();
}

void ApiServer::install_routes(const std::string& who) {
  http::Server& s = *svr_;
  configure_server(s, opt_, who, [this] { backend_.count_response(401); });
  s.get("/health", [this](const http::Request& req, http::Response& res) { handle_health(req, res); });
  s.get("/metrics", [this](const http::Request& req, http::Response& res) { handle_metrics(req, res); });
  s.get("/admin/ffn", [this](const http::Request& req, http::Response& res) { handle_admin_ffn(req, res); });
  s.post("/admin/ffn", [this](const http::Request& req, http::Response& res) { handle_admin_ffn(req, res); });
  s.get("/v1/models", [this](const http::Request& req, http::Response& res) { handle_models(req, res); });
  s.post("/v1/completions", [this](const http::Request& req, http::Response& res) {
    handle_generation(Endpoint::completions, "/v1/completions", req, res);
  });
  s.post("/v1/chat/completions", [this](const http::Request& req, http::Response& res) {
    handle_generation(Endpoint::chat, "/v1/chat/completions", req, res);
  });
  backend_.extra_routes(s);
}

// Readiness: 503 (with why) while the backend cannot run a request, e.g. an AFD attention
// worker whose FFN worker is not connected, or a front end with no attention worker up;
// a front end then places requests elsewhere, or answers 503 + Retry-After itself.
void ApiServer::handle_health(const http::Request&, http::Response& res) {
  if (backend_.stopping()) return send_error(res, 503, "shutting down", opt_.retry_after_s);
  if (backend_.draining()) return send_error(res, 503, kDrainingHealth, opt_.retry_after_s);
  Readiness r = backend_.readiness();
  if (!r.ready) return send_error(res, 503, r.text, opt_.retry_after_s);
  res.set_content(r.text, "application/json");
}

void ApiServer::handle_metrics(const http::Request&, http::Response& res) {
  res.set_content(backend_.metrics_text(), "text/plain; version=0.0.4");
}

// FFN membership (serve/scheduling/ffn_admin.h, serve/frontend/frontend_ffn_admin.h). Protected like the API:
// with an API key, configure_server's Bearer check covers /admin/ too.
void ApiServer::handle_admin_ffn(const http::Request& req, http::Response& res) {
  std::optional<AdminAnswer> a = backend_.admin_ffn(req.method, req.body);
  if (!a) return send_error(res, 404, "no FFN membership here (not an AFD attention worker)", opt_.retry_after_s);
  res.status = a->first;
  res.set_content(a->second, "application/json");
}

void ApiServer::handle_models(const http::Request&, http::Response& res) {
  nlohmann::ordered_json m = {{"object", "list"},
                              {"data", nlohmann::ordered_json::array({{{"id", model_.limits.model_name},
                                                                       {"object", "model"},
                                                                       {"created", created_},
                                                                       {"owned_by", "afd"},
                                                                       {"max_model_len", model_.limits.max_context}}})}};
  res.set_content(m.dump(), "application/json");
  backend_.count_response(200);
}

void ApiServer::handle_generation(Endpoint ep, const std::string& path, const http::Request& req,
                                  http::Response& res) {
  const int retry_s = opt_.retry_after_s;
  InFlight in_flight(backend_.in_flight());  // raised before the draining check: drained() waits for it
  if (backend_.stopping() || backend_.draining()) {
    backend_.count_response(503);
    return send_error(res, 503, refusal_while_closing(backend_.stopping()), retry_s);
  }
  const ChatTemplate* chat = model_.chat ? &*model_.chat : nullptr;
  const uint64_t id = next_id_.fetch_add(1);
  // A front end's internal stream (serve/api/internal_stream.h): control line + the client's body.
  std::optional<InternalBody> internal;
  if (backend_.serves_internal_streams() && req.has_header(kInternalStreamHeader)) {
    auto b = split_internal_body(req.body);
    if (!b.ok()) {
      backend_.count_response(400);
      return send_error(res, 400, b.status().message(), retry_s);
    }
    internal = std::move(*b);
  }
  // Validate and tokenize before the backend sees the request: 4xx answers are given here (a
  // front end's never reach a worker), and the prompt tokens drive placement.
  auto admitted = admission_->run(req.body.size(), [&]() -> Result<GenerationRequest> {
    auto g = internal ? parse_internal_request(ep, *internal, *model_.tokenizer, chat, model_.limits)
                      : parse_request(ep, req.body, *model_.tokenizer, chat, model_.limits, id * 0x9E3779B97F4A7C15ULL);
    // A constrained answer's grammar is compiled here too (cached by its text), so a grammar
    // that does not compile is a 400 before anything runs.
    if (g.ok() && !g->format.gbnf.empty()) {
      if (!model_.grammars) return not_supported("this server has no grammar support for '" + g->format.kind + "'");
      auto compiled = model_.grammars->get(g->format.gbnf);
      if (!compiled.ok()) return compiled.status().with_context("'" + g->format.kind + "'");
      g->format.grammar = std::move(*compiled);
    }
    return g;
  });
  if (!admitted) {
    backend_.count_response(503);
    return send_error(res, 503, kAdmissionFull, retry_s);
  }
  auto& g = *admitted;
  if (!g.ok()) {
    const int st = http_status_for(g.status());
    backend_.count_response(st);
    return send_error(res, st, g.status().message(), retry_s);
  }
  GenerationCall call;
  call.endpoint = ep;
  call.path = path;
  call.request = std::move(*g);
  char idbuf[32];
  std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(id));
  call.meta.id = std::string(ep == Endpoint::chat ? "chatcmpl-" : "cmpl-") + idbuf;
  call.meta.model = model_.limits.model_name;
  call.meta.created = static_cast<int64_t>(std::time(nullptr));
  call.meta.endpoint = ep;
  call.meta.logprobs = call.request.logprobs;
  call.meta.system_fingerprint = model_.system_fingerprint;
  call.meta.tool_calls = call.request.format.tool_calls;
  call.meta.parallel_tool_calls = call.request.format.parallel_tool_calls;
  call.meta.tool_syntax = call.request.format.tool_syntax;
  call.internal = internal ? &*internal : nullptr;
  call.in_flight = &in_flight;
  backend_.generate(call, req, res);
}

}  // namespace afd::serve
