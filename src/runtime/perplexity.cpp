#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <string>

#include "core/timer.h"

namespace afd {

namespace {

// Logits held by one forward call at most (floats): 256 MiB, whatever the vocabulary.
constexpr int64_t kMaxLogitFloats = int64_t{1} << 26;

struct Job {
  size_t doc = 0;
  ScoreWindow w;
  int64_t seq = -1;
  int64_t mtp_seq = -1;   // with an MTP head
  int64_t fed = 0;        // window tokens appended so far
  int64_t kv_blocks = 0;  // blocks reserved for the whole window
  int64_t length() const { return w.end - w.begin; }
};

// Releases the sequences of the jobs still active when it goes out of scope.
class ActiveSequences {
 public:
  ActiveSequences(Engine& e, MtpHead* mtp) : engine_(e), mtp_(mtp) {}
  ~ActiveSequences() {
    for (const Job* j : jobs_) release(*j);
  }
  void release(const Job& j) {
    engine_.release_sequence(j.seq);
    if (mtp_ && j.mtp_seq >= 0) mtp_->release_sequence(j.mtp_seq);
  }
  std::vector<Job*>& jobs() { return jobs_; }

 private:
  Engine& engine_;
  MtpHead* mtp_;
  std::vector<Job*> jobs_;
};

// Adds -log softmax(row)[target] (in double) to *nll_sum, and 1 to *top1 when target is the
// row's first largest logit.
void score_row(const float* row, int64_t vocab, int32_t target, double* nll_sum, int64_t* top1, int64_t* n) {
  int64_t arg = 0;
  for (int64_t v = 1; v < vocab; ++v) {
    if (row[v] > row[arg]) arg = v;
  }
  const double m = row[arg];
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - m);
  *nll_sum += m + std::log(sum) - static_cast<double>(row[target]);
  *top1 += arg == target ? 1 : 0;
  *n += 1;
}

}  // namespace

std::vector<ScoreWindow> plan_score_windows(int64_t n_tokens, int64_t window, int64_t stride) {
  std::vector<ScoreWindow> out;
  if (n_tokens < 2) return out;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n_tokens; begin += stride) {
    const int64_t end = std::min(begin + window, n_tokens);
    const int64_t score_begin = std::max(prev_end, begin + 1);
    if (score_begin < end) out.push_back({begin, end, score_begin});
    prev_end = end;
    if (end == n_tokens) break;
  }
  return out;
}

Result<ScoreResult> score_documents(Engine& engine, const std::vector<std::vector<int32_t>>& documents,
                                    const ScoreOptions& opt) {
  const ModelConfig& cfg = engine.config();
  if (opt.window < 2) return invalid_argument("window " + std::to_string(opt.window) + ": must be at least 2");
  if (opt.stride < 1 || opt.stride > opt.window)
    return invalid_argument("stride " + std::to_string(opt.stride) + ": must be in [1, window " +
                            std::to_string(opt.window) + "]");
  if (cfg.max_position_embeddings > 0 && opt.window > cfg.max_position_embeddings)
    return invalid_argument("window " + std::to_string(opt.window) + ": longer than the model's context (" +
                            "max_position_embeddings " + std::to_string(cfg.max_position_embeddings) + ")");
  if (opt.max_seqs_per_call < 1 || opt.max_tokens_per_call < 1)
    return invalid_argument("sequences and tokens per forward call must be positive");
  const int64_t vocab = cfg.vocab_size;
  for (size_t d = 0; d < documents.size(); ++d) {
    for (int32_t t : documents[d]) {
      if (t < 0 || t >= vocab)
        return invalid_argument("document " + std::to_string(d) + ": token id " + std::to_string(t) +
                                " outside the model's vocabulary (vocab_size " + std::to_string(vocab) + ")");
    }
  }

  std::vector<Job> jobs;
  int64_t total = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    for (const ScoreWindow& w : plan_score_windows(static_cast<int64_t>(documents[d].size()), opt.window, opt.stride)) {
      jobs.push_back(Job{d, w});
      total += w.end - w.begin;
    }
  }
  const KvUsage kv = engine.kv_usage();
  const bool count_blocks = kv.blocks_total > 0;
  const int64_t tokens_per_call = std::min(opt.max_tokens_per_call, std::max<int64_t>(1, kMaxLogitFloats / vocab));

  MtpHead* const mtp = opt.mtp;
  if (mtp && mtp->config().vocab_size != vocab)
    return invalid_argument("the MTP head's vocabulary differs from the model's");

  ScoreResult res;
  res.documents = static_cast<int64_t>(documents.size());
  const int64_t t0 = now_ns();
  std::deque<Job*> pending;
  for (Job& j : jobs) pending.push_back(&j);
  ActiveSequences active(engine, mtp);
  int64_t reserved = 0;
  std::vector<BatchItem> items;
  std::vector<Job*> fed_jobs;
  std::vector<float> logits, hidden, mtp_logits;
  std::vector<MtpHead::Item> mtp_items;
  std::vector<size_t> mtp_of;  // the items index of each MTP item
  while (!pending.empty() || !active.jobs().empty()) {
    // Admit windows while the sequences and the KV cache (whole windows reserved) allow.
    while (!pending.empty() && static_cast<int64_t>(active.jobs().size()) < opt.max_seqs_per_call) {
      Job* j = pending.front();
      j->kv_blocks = count_blocks ? engine.kv_blocks_needed(Engine::kNewSequence, j->length()) : 0;
      if (count_blocks && reserved + j->kv_blocks > kv.blocks_total) {
        if (!active.jobs().empty()) break;
        return resource_exhausted("a window of " + std::to_string(j->length()) + " tokens needs " +
                                  std::to_string(j->kv_blocks) + " KV blocks; the cache has " +
                                  std::to_string(kv.blocks_total) + " (raise the KV capacity or lower the window)");
      }
      AFD_ASSIGN_OR_RETURN(j->seq, engine.create_sequence());
      if (mtp) {
        auto ms = mtp->create_sequence();
        if (!ms.ok()) {
          engine.release_sequence(j->seq);
          return ms.status();
        }
        j->mtp_seq = *ms;
      }
      reserved += j->kv_blocks;
      active.jobs().push_back(j);
      pending.pop_front();
    }
    // One chunk of each active window, in order, within the token budget.
    items.clear();
    fed_jobs.clear();
    int64_t budget = tokens_per_call;
    for (Job* j : active.jobs()) {
      const int64_t n = std::min(j->length() - j->fed, budget);
      if (n <= 0) break;
      const int32_t* at = documents[j->doc].data() + j->w.begin + j->fed;
      items.push_back(BatchItem{j->seq, std::span<const int32_t>(at, static_cast<size_t>(n)), true});
      fed_jobs.push_back(j);
      budget -= n;
    }
    if (mtp) {
      AFD_RETURN_IF_ERROR(engine.forward_with_hidden(items, &logits, &hidden));
    } else {
      AFD_RETURN_IF_ERROR(engine.forward(items, &logits));
    }
    int64_t row = 0;
    mtp_items.clear();
    mtp_of.clear();
    for (size_t k = 0; k < items.size(); ++k) {
      Job* j = fed_jobs[k];
      const std::vector<int32_t>& doc = documents[j->doc];
      const int64_t n = static_cast<int64_t>(items[k].tokens.size());
      if (mtp) {
        // Rows q with t[q+1] inside the window: [fed, min(fed + n, length - 1)).
        const int64_t m = std::min(n, j->length() - 1 - j->fed);
        if (m > 0) {
          const int32_t* next = doc.data() + j->w.begin + j->fed + 1;
          mtp_items.push_back(MtpHead::Item{j->mtp_seq,
                                            std::span<const float>(&hidden[static_cast<size_t>(row * cfg.hidden_size)],
                                                                   static_cast<size_t>(m * cfg.hidden_size)),
                                            std::span<const int32_t>(next, static_cast<size_t>(m))});
          mtp_of.push_back(k);
        }
      }
      for (int64_t r = 0; r < n; ++r, ++row) {
        const int64_t target = j->w.begin + j->fed + r + 1;  // the position this row predicts
        if (target >= j->w.score_begin && target < j->w.end)
          score_row(&logits[static_cast<size_t>(row * vocab)], vocab, doc[static_cast<size_t>(target)], &res.nll_sum,
                    &res.top1_correct, &res.tokens);
      }
    }
    if (!mtp_items.empty()) {
      AFD_RETURN_IF_ERROR(mtp->forward(mtp_items, &mtp_logits));
      int64_t mrow = 0;
      for (size_t i = 0; i < mtp_items.size(); ++i) {
        const Job* j = fed_jobs[mtp_of[i]];
        const std::vector<int32_t>& doc = documents[j->doc];
        const int64_t m = static_cast<int64_t>(mtp_items[i].next_tokens.size());
        for (int64_t r = 0; r < m; ++r, ++mrow) {
          const int64_t target = j->w.begin + j->fed + r + 2;  // the token after next
          if (target >= std::max(j->w.score_begin, j->w.begin + 2) && target < j->w.end)
            score_row(&mtp_logits[static_cast<size_t>(mrow * vocab)], vocab, doc[static_cast<size_t>(target)],
                      &res.mtp_nll_sum, &res.mtp_top1_correct, &res.mtp_tokens);
        }
      }
    }
    for (size_t k = 0; k < items.size(); ++k) {
      const int64_t n = static_cast<int64_t>(items[k].tokens.size());
      fed_jobs[k]->fed += n;
      res.forwarded_tokens += n;
    }
    auto& act = active.jobs();
    for (auto it = act.begin(); it != act.end();) {
      if ((*it)->fed < (*it)->length()) {
        ++it;
        continue;
      }
      active.release(**it);
      reserved -= (*it)->kv_blocks;
      it = act.erase(it);
    }
    if (opt.progress) opt.progress(res.forwarded_tokens, total);
  }
  res.seconds = static_cast<double>(now_ns() - t0) * 1e-9;
  return res;
}

}  // namespace afd
