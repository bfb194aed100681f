#include "serve/scheduling/service.h"

#include <algorithm>
#include <filesystem>

#include "core/log.h"
#include "serve/api/model_serving.h"

namespace afd::serve {

Result<std::unique_ptr<Service>> Service::create(const ServiceOptions& opt, std::vector<std::unique_ptr<Engine>> engines,
                                                 std::vector<std::unique_ptr<Drafter>> drafters) {
  if (engines.empty()) return invalid_argument("serve: no engine");
  if (!drafters.empty() && drafters.size() != engines.size())
    return invalid_argument("serve: " + std::to_string(drafters.size()) + " drafters for " +
                            std::to_string(engines.size()) + " engines");
  std::unique_ptr<Service> s(new Service());
  const ModelConfig& cfg = engines[0]->config();
  for (auto& e : engines)
    if (e->config().vocab_size != cfg.vocab_size)
      return invalid_argument("serve: the engines disagree on the model's vocabulary size");

  AFD_ASSIGN_OR_RETURN(s->model_, load_model_serving(opt.model_dir, opt.model_name, opt.max_context, cfg));
  s->model_.limits.content_special_as_text = opt.server.content_special_as_text;
  s->model_.system_fingerprint = opt.system_fingerprint;
  s->model_.deterministic = opt.deterministic;

  const int n = static_cast<int>(engines.size());
  s->engines_ = std::move(engines);
  s->drafters_ = std::move(drafters);
  s->metrics_ = std::make_unique<Metrics>(n);
  std::vector<Scheduler*> raw;
  for (int i = 0; i < n; ++i) {
    s->schedulers_.push_back(
        std::make_unique<Scheduler>(s->engines_[i].get(), opt.scheduler, &s->metrics_->worker(i), s->metrics_.get(),
                                    s->drafters_.empty() ? nullptr : s->drafters_[i].get()));
    raw.push_back(s->schedulers_.back().get());
  }
  Metrics* m = s->metrics_.get();
  const int64_t block = std::max<int64_t>(1, s->engines_[0]->kv_usage().block_size);
  s->router_ = std::make_unique<Router>(n, [m](int w) { return m->worker(w).token_load.load(); }, block);
  s->backend_ = std::make_unique<LocalBackend>(s->model_, raw, s->router_.get(), m, opt.server.retry_after_s);
  if (opt.ffn_admin) s->backend_->set_ffn_admin(opt.ffn_admin);
  s->api_ = std::make_unique<ApiServer>(opt.server, "request handler", s->model_, *s->backend_);
  return s;
}

Service::~Service() { stop(); }

Status Service::start() {
  AFD_RETURN_IF_ERROR(api_->bind());
  for (auto& sc : schedulers_) sc->start();
  return Status();
}

Status Service::run() { return api_->run(); }

void Service::stop() {
  if (backend_) backend_->stop();
  if (api_) api_->stop();
  for (auto& sc : schedulers_) sc->stop();
}

}  // namespace afd::serve
