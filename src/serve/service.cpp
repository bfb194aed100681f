#include "serve/service.h"

#include <algorithm>
#include <filesystem>

#include "core/log.h"

namespace afd::serve {

Result<std::unique_ptr<Service>> Service::create(const ServiceOptions& opt, std::vector<std::unique_ptr<Engine>> engines) {
  if (engines.empty()) return invalid_argument("serve: no engine");
  std::unique_ptr<Service> s(new Service());
  const ModelConfig& cfg = engines[0]->config();
  for (auto& e : engines)
    if (e->config().vocab_size != cfg.vocab_size)
      return invalid_argument("serve: the engines disagree on the model's vocabulary size");

  const std::string tok_path = opt.model_dir + "/tokenizer.json";
  auto tok = Tokenizer::load(tok_path);
  if (!tok.ok())
    return tok.status().with_context("serve needs " + tok_path +
                                     " (afd make-model writes one; Hugging Face checkpoints ship one)");
  s->model_.tokenizer = *tok;
  const std::string cfg_path = opt.model_dir + "/tokenizer_config.json";
  auto chat = ChatTemplate::load(cfg_path);
  if (chat.ok()) {
    s->model_.chat = std::move(*chat);
  } else if (chat.status().code() == StatusCode::not_found) {
    spdlog::warn("serve: no chat template ({}); /v1/chat/completions will answer 400", chat.status().message());
  } else {
    return chat.status();
  }
  for (int64_t id : cfg.eos_token_ids) s->model_.eos_ids.push_back(static_cast<int32_t>(id));
  if (s->model_.chat && !s->model_.chat->eos_token().empty()) {
    int32_t id = s->model_.tokenizer->token_id(s->model_.chat->eos_token());
    if (id >= 0 && std::find(s->model_.eos_ids.begin(), s->model_.eos_ids.end(), id) == s->model_.eos_ids.end())
      s->model_.eos_ids.push_back(id);
  }
  RequestLimits& lim = s->model_.limits;
  lim.model_name = opt.model_name;
  if (lim.model_name.empty()) {
    std::filesystem::path p(opt.model_dir);
    lim.model_name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
    if (lim.model_name.empty()) lim.model_name = "afd-model";
  }
  lim.vocab_size = cfg.vocab_size;
  lim.max_context = opt.max_context > 0 ? opt.max_context : cfg.max_position_embeddings;
  if (lim.max_context <= 1) return invalid_argument("serve: the model's context length is " + std::to_string(lim.max_context));
  if (s->model_.tokenizer->vocab_size() > cfg.vocab_size)
    spdlog::warn("serve: tokenizer has {} tokens but the model only {}; prompts using the extra ids are rejected",
                 s->model_.tokenizer->vocab_size(), cfg.vocab_size);

  const int n = static_cast<int>(engines.size());
  s->engines_ = std::move(engines);
  s->metrics_ = std::make_unique<Metrics>(n);
  std::vector<Scheduler*> raw;
  for (int i = 0; i < n; ++i) {
    s->schedulers_.push_back(
        std::make_unique<Scheduler>(s->engines_[i].get(), opt.scheduler, &s->metrics_->worker(i), s->metrics_.get()));
    raw.push_back(s->schedulers_.back().get());
  }
  Metrics* m = s->metrics_.get();
  const int64_t block = std::max<int64_t>(1, s->engines_[0]->kv_usage().block_size);
  s->router_ = std::make_unique<Router>(n, [m](int w) { return m->worker(w).token_load.load(); }, block);
  s->http_ = std::make_unique<HttpServer>(opt.server, s->model_, raw, s->router_.get(), m);
  return s;
}

Service::~Service() { stop(); }

Status Service::start() {
  AFD_RETURN_IF_ERROR(http_->bind());
  for (auto& sc : schedulers_) sc->start();
  return Status::ok();
}

Status Service::run() { return http_->run(); }

void Service::stop() {
  if (http_) http_->stop();
  for (auto& sc : schedulers_) sc->stop();
}

}  // namespace afd::serve
