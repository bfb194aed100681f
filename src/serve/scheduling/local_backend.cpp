#include "serve/scheduling/local_backend.h"

#include <cstdio>
#include <random>

#include "core/log.h"
#include "core/timer.h"
#include "serve/api/response.h"
#include "serve/http/client_connection.h"
#include "serve/http/server.h"
#include "serve/scheduling/worker_resume.h"

namespace afd::serve {

std::string attention_health_body(const ModelServing& m, const std::string& instance) {
  return nlohmann::ordered_json{{"status", "ok"},
                                {"role", "attention"},
                                {"model", m.limits.model_name},
                                {"model_config", config_fingerprint_hex(m)},
                                {"system_fingerprint", m.system_fingerprint.empty()
                                                           ? nlohmann::ordered_json(nullptr)
                                                           : nlohmann::ordered_json(m.system_fingerprint)},
                                {"deterministic", m.deterministic},
                                {"instance", instance}}
      .dump();
}

LocalBackend::LocalBackend(const ModelServing& model, std::vector<Scheduler*> workers, Router* router,
                           Metrics* metrics, int retry_after_s)
    : model_(model), workers_(std::move(workers)), router_(router), metrics_(metrics), retry_after_s_(retry_after_s) {
  std::random_device rd;
  char inst[17];
  std::snprintf(inst, sizeof inst, "%08x%08x", rd(), rd());
  instance_ = inst;
}

bool LocalBackend::drained() const {
  // admitting_ is raised before a handler reads draining_: a handler that saw it false and
  // has not submitted yet keeps this false until its request is in a scheduler's queue.
  if (admitting_.load() != 0) return false;
  for (Scheduler* s : workers_)
    if (!s->idle()) return false;
  return true;
}

Readiness LocalBackend::readiness() const {
  // An engine that cannot run a forward pass (e.g. an AFD attention worker whose FFN worker
  // is not connected) makes the whole server unready.
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (Status h = workers_[i]->engine_health(); !h.is_ok()) {
      std::string why = h.message();
      if (workers_.size() > 1) why = "worker " + std::to_string(i) + ": " + why;
      return {false, why};
    }
  }
  return {true, attention_health_body(model_, instance_)};
}

std::optional<AdminAnswer> LocalBackend::admin_ffn(const std::string& method, const std::string& body) {
  if (!ffn_admin_) return std::nullopt;
  return ffn_admin_(method, body);
}

void LocalBackend::generate(GenerationCall& call, const http::Request& req, http::Response& res) {
  auto sr = std::make_shared<SeqRequest>(call.request, model_.tokenizer.get(), model_.eos_ids, now_s());
  if (Status rs = call.internal ? apply_resume(call.internal->control, sr.get()) : Status(); !rs.is_ok()) {
    metrics_->request_finished(400);
    return send_error(res, 400, rs.message(), retry_after_s_);
  }
  int w = router_->place(sr->tokens);
  Status sub = workers_[w]->submit(sr);
  call.in_flight->release();  // in a queue now (or refused): the scheduler's idle() covers it
  if (!sub.is_ok()) {
    int st = sub.code() == StatusCode::resource_exhausted ? 429 : 503;
    metrics_->requests_rejected.fetch_add(1);
    metrics_->request_finished(st);
    return send_error(res, st, sub.message(), retry_after_s_);
  }
  if (call.internal) return answer_internal_stream(sr->channel, call.internal->control.keepalive_ms, res);
  if (!call.request.stream) return answer_whole(call, sr->channel, req, res);
  answer_stream(call, sr->channel, res);
}

void LocalBackend::answer_internal_stream(const std::shared_ptr<RequestChannel>& ch, int64_t keepalive_ms,
                                          http::Response& res) {
  metrics_->request_finished(200);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, ch, keepalive_ms](size_t, http::DataSink& sink) {
        const bool done = pump_internal_stream(
            *ch, keepalive_ms, [&](const std::string& s) { return sink.write(s.data(), s.size()); },
            [this] { return stopping_.load(); });
        if (done) sink.done();
        return done;
      },
      [ch](bool success) {
        if (!success) ch->cancel();
      });
}

void LocalBackend::answer_whole(const GenerationCall& call, const std::shared_ptr<RequestChannel>& ch,
                                const http::Request& req, http::Response& res) {
  // A client that disconnects before the answer is ready cancels the request (as a failed
  // write does for a stream): checked every 50 ms while waiting; the scheduler frees the
  // sequence at its next step.
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
      return send_error(res, 499, "client closed the connection", retry_after_s_);
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
        return send_error(res, st, e.error.message(), retry_after_s_);
      }
      c.finish = e.finish;
      c.prompt_tokens = e.prompt_tokens;
      c.completion_tokens = e.completion_tokens;
    }
    if (done) break;
  }
  metrics_->request_finished(200);
  res.set_content(completion_body(call.meta, *model_.tokenizer, c), "application/json");
}

void LocalBackend::answer_stream(const GenerationCall& call, const std::shared_ptr<RequestChannel>& ch,
                                 http::Response& res) {
  metrics_->request_finished(200);
  const bool include_usage = call.request.include_usage;
  auto tok = model_.tokenizer;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // State shared across provider calls; the provider runs on the handler's thread.
  struct StreamState {
    bool first = true;
    int64_t text_offset = 0;
    std::unique_ptr<ToolCallStream> tools;
  };
  auto state = std::make_shared<StreamState>();
  state->tools = call.meta.tool_call_stream();
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, ch, meta = call.meta, tok, include_usage, state](size_t, http::DataSink& sink) {
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
              out = stream_chunk(meta, *tok, e, state->first, include_usage, state->text_offset, state->tools.get());
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
}

}  // namespace afd::serve
