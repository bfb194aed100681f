#include "serve/http_server.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>

#include "core/log.h"
#include "core/timer.h"
#include "serve/client_connection.h"
#include "serve/http/server.h"
#include "serve/http_common.h"
#include "serve/response.h"
#include "serve/worker_resume.h"

namespace afd::serve {
namespace {

using json = nlohmann::ordered_json;

}  // namespace

std::string config_fingerprint_hex(const ModelServing& m) {
  char fp[17];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(m.config_fingerprint));
  return fp;
}

std::string attention_health_body(const ModelServing& m, const std::string& instance) {
  return json{{"status", "ok"},
              {"role", "attention"},
              {"model", m.limits.model_name},
              {"model_config", config_fingerprint_hex(m)},
              {"instance", instance}}
      .dump();
}

HttpServer::HttpServer(ServerOptions opt, ModelServing model, std::vector<Scheduler*> workers, Router* router,
                       Metrics* metrics)
    : opt_(std::move(opt)),
      model_(std::move(model)),
      workers_(std::move(workers)),
      router_(router),
      metrics_(metrics),
      admission_(std::make_unique<AdmissionLane>(opt_.admission)),
      svr_(std::make_unique<http::Server>(http_options(opt_, "request handler"))) {
  created_ = static_cast<int64_t>(std::time(nullptr));
  std::random_device rd;
  next_id_ = (static_cast<uint64_t>(rd()) << 20) | 1;
  char inst[17];
  std::snprintf(inst, sizeof inst, "%08x%08x", rd(), rd());
  instance_ = inst;
  install_routes();
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::bind() {
  AFD_ASSIGN_OR_RETURN(port_, bind_server(*svr_, opt_));
  return Status::ok();
}

Status HttpServer::run() {
  if (port_ < 0) AFD_RETURN_IF_ERROR(bind());
  if (!svr_->run()) return io_error("the HTTP server is not bound");
  return Status::ok();
}

void HttpServer::stop() {
  stopping_ = true;
  if (svr_) svr_->stop();
}

void HttpServer::drain() { draining_ = true; }

bool HttpServer::drained() const {
  // admitting_ is raised before a handler reads draining_: a handler that saw it false and
  // has not submitted yet keeps this false until its request is in a scheduler's queue.
  if (admitting_.load() != 0) return false;
  for (Scheduler* s : workers_)
    if (!s->idle()) return false;
  return true;
}

void HttpServer::install_routes() {
  http::Server& s = *svr_;
  configure_server(s, opt_, "request handler", [this] { metrics_->request_finished(401); });

  // Readiness: 503 (with why) while an engine cannot run a forward pass, e.g. an AFD
  // attention worker whose FFN worker is not connected; the front end then places requests
  // elsewhere, or answers 503 + Retry-After itself.
  s.get("/health", [this](const http::Request&, http::Response& res) {
    if (stopping_) return send_error(res, 503, "shutting down", opt_.retry_after_s);
    if (draining_)
      return send_error(res, 503, kDrainingHealth, opt_.retry_after_s);
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (Status h = workers_[i]->engine_health(); !h.is_ok()) {
        std::string why = h.message();
        if (workers_.size() > 1) why = "worker " + std::to_string(i) + ": " + why;
        return send_error(res, 503, why, opt_.retry_after_s);
      }
    }
    res.set_content(attention_health_body(model_, instance_), "application/json");
  });
  s.get("/metrics", [this](const http::Request&, http::Response& res) {
    res.set_content(metrics_->render(), "text/plain; version=0.0.4");
  });
  // FFN membership (serve/ffn_admin.h). Protected like the API: with an API key, the same
  // Bearer check as /v1/* (configure_server's pre-routing check covers /admin/ too).
  auto admin = [this](const http::Request& req, http::Response& res) {
    if (!ffn_admin_) return send_error(res, 404, "no FFN membership here (not an AFD attention worker)", opt_.retry_after_s);
    auto [code, body] = ffn_admin_(req.method, req.body);
    res.status = code;
    res.set_content(body, "application/json");
  };
  s.get("/admin/ffn", admin);
  s.post("/admin/ffn", admin);
  s.get("/v1/models", [this](const http::Request&, http::Response& res) {
    json m = {{"object", "list"},
              {"data", json::array({{{"id", model_.limits.model_name},
                                     {"object", "model"},
                                     {"created", created_},
                                     {"owned_by", "afd"},
                                     {"max_model_len", model_.limits.max_context}}})}};
    res.set_content(m.dump(), "application/json");
    metrics_->request_finished(200);
  });

  auto generate = [this](Endpoint ep, const http::Request& req, http::Response& res) {
    InFlight admitting(admitting_);  // until the request is in a scheduler (or refused): drained() waits for it
    if (stopping_ || draining_) {
      metrics_->request_finished(503);
      return send_error(res, 503, refusal_while_closing(stopping_),
                        opt_.retry_after_s);
    }
    const ChatTemplate* chat = model_.chat ? &*model_.chat : nullptr;
    uint64_t id = next_id_.fetch_add(1);
    // A front end's internal stream (serve/internal_stream.h): control line + the client's body.
    std::optional<InternalBody> internal;
    if (req.has_header(kInternalStreamHeader)) {
      auto b = split_internal_body(req.body);
      if (!b.ok()) {
        metrics_->request_finished(400);
        return send_error(res, 400, b.status().message(), opt_.retry_after_s);
      }
      internal = std::move(*b);
    }
    auto admitted = admission_->run(req.body.size(), [&] {
      return internal ? parse_internal_request(ep, *internal, *model_.tokenizer, chat, model_.limits)
                      : parse_request(ep, req.body, *model_.tokenizer, chat, model_.limits, id * 0x9E3779B97F4A7C15ULL);
    });
    if (!admitted) {
      metrics_->request_finished(503);
      return send_error(res, 503, kAdmissionFull, opt_.retry_after_s);
    }
    auto& g = *admitted;
    if (!g.ok()) {
      int st = http_status_for(g.status());
      metrics_->request_finished(st);
      return send_error(res, st, g.status().message(), opt_.retry_after_s);
    }
    auto sr = std::make_shared<SeqRequest>(*g, model_.tokenizer.get(), model_.eos_ids, now_s());
    if (Status rs = internal ? apply_resume(internal->control, sr.get()) : Status::ok(); !rs.is_ok()) {
      metrics_->request_finished(400);
      return send_error(res, 400, rs.message(), opt_.retry_after_s);
    }
    int w = router_->place(sr->tokens);
    Status sub = workers_[w]->submit(sr);
    admitting.release();  // in a queue now (or refused): the scheduler's idle() covers it
    if (!sub.is_ok()) {
      int st = sub.code() == StatusCode::resource_exhausted ? 429 : 503;
      metrics_->requests_rejected.fetch_add(1);
      metrics_->request_finished(st);
      return send_error(res, st, sub.message(), opt_.retry_after_s);
    }
    ResponseMeta meta;
    char idbuf[32];
    std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(id));
    meta.id = std::string(ep == Endpoint::chat ? "chatcmpl-" : "cmpl-") + idbuf;
    meta.model = model_.limits.model_name;
    meta.created = static_cast<int64_t>(std::time(nullptr));
    meta.endpoint = ep;
    meta.logprobs = g->logprobs;
    std::shared_ptr<RequestChannel> ch = sr->channel;

    if (internal) {
      metrics_->request_finished(200);
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, ch, keepalive = internal->control.keepalive_ms](size_t, http::DataSink& sink) {
            const bool done = pump_internal_stream(
                *ch, keepalive, [&](const std::string& s) { return sink.write(s.data(), s.size()); },
                [this] { return stopping_.load(); });
            if (done) sink.done();
            return done;
          },
          [ch](bool success) {
            if (!success) ch->cancel();
          });
      return;
    }

    if (!g->stream) {
      // A client that disconnects before the answer is ready cancels the request (as a
      // failed write does for a stream): checked every 50 ms while waiting; the scheduler
      // frees the sequence at its next step.
      const int conn = connection_socket(req);
      if (conn < 0) spdlog::debug("non-streaming request: connection socket not found, no disconnect detection");
      Completion c;
      double next_check = now_s() + 0.05;
      for (;;) {
        std::vector<StreamEvent> evs = ch->wait(std::chrono::milliseconds(50));
        const double now = now_s();
        if (conn >= 0 && now >= next_check && peer_closed(conn)) {
          ch->cancel();
          metrics_->request_finished(499);  // nginx's "client closed request"; nobody reads it
          return send_error(res, 499, "client closed the connection", opt_.retry_after_s);
        }
        if (now >= next_check) next_check = now + 0.05;
        bool done = false;
        for (StreamEvent& e : evs) {
          c.text += e.text;
          for (TokenInfo& t : e.tokens) c.tokens.push_back(std::move(t));
          if (e.finish == FinishReason::none) continue;
          done = true;
          if (e.finish == FinishReason::error || e.finish == FinishReason::cancelled) {
            int st = e.finish == FinishReason::cancelled ? 503 : http_status_for(e.error);
            if (st == 200) st = 500;
            metrics_->request_finished(st);
            return send_error(res, st, e.error.message(), opt_.retry_after_s);
          }
          c.finish = e.finish;
          c.prompt_tokens = e.prompt_tokens;
          c.completion_tokens = e.completion_tokens;
        }
        if (done) break;
      }
      metrics_->request_finished(200);
      res.set_content(completion_body(meta, *model_.tokenizer, c), "application/json");
      return;
    }

    metrics_->request_finished(200);
    const bool include_usage = g->include_usage;
    auto tok = model_.tokenizer;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    // State shared across provider calls; the provider runs on this handler's thread.
    struct StreamState {
      bool first = true;
      int64_t text_offset = 0;
    };
    auto state = std::make_shared<StreamState>();
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ch, meta, tok, include_usage, state](size_t, http::DataSink& sink) {
          for (;;) {
            std::vector<StreamEvent> evs = ch->wait(std::chrono::milliseconds(200));
            if (stopping_ && evs.empty()) {
              ch->cancel();
              return false;
            }
            for (StreamEvent& e : evs) {
              std::string out;
              if (e.finish == FinishReason::error || e.finish == FinishReason::cancelled) {
                int st = http_status_for(e.error);
                out = "data: " + error_body(st == 200 ? 500 : st, e.error.message()) + "\n\ndata: [DONE]\n\n";
                sink.write(out.data(), out.size());
                sink.done();
                return true;
              }
              if (!e.tokens.empty() || !e.text.empty() || e.finish != FinishReason::none) {
                out = stream_chunk(meta, *tok, e, state->first, include_usage, state->text_offset);
                state->first = false;
                state->text_offset += static_cast<int64_t>(e.text.size());
              }
              if (e.finish != FinishReason::none) {
                if (include_usage) out += stream_usage_chunk(meta, e.prompt_tokens, e.completion_tokens);
                out += "data: [DONE]\n\n";
              }
              if (!out.empty() && !sink.write(out.data(), out.size())) {
                ch->cancel();  // client went away: the scheduler frees the sequence
                return false;
              }
              if (e.finish != FinishReason::none) {
                sink.done();
                return true;
              }
            }
          }
        },
        [ch](bool success) {
          if (!success) ch->cancel();
        });
  };
  s.post("/v1/completions",
         [generate](const http::Request& req, http::Response& res) { generate(Endpoint::completions, req, res); });
  s.post("/v1/chat/completions",
         [generate](const http::Request& req, http::Response& res) { generate(Endpoint::chat, req, res); });
}

}  // namespace afd::serve
