// Scheduler: continuous batching over one Engine (one attention worker). A dedicated
// thread runs step() in a loop; step() is a sequence of small named steps that tests
// drive one by one against a fake Engine:
//   drop_cancelled -> admit (KV capacity, slots) -> form_batch (decode first, then prefill
//   chunks; preempts the newest sequences by recompute when KV runs out) -> forward ->
//   process_logits (sample, detokenize, stop, release finished sequences).
// Speculative decoding (runtime/speculative.h): with a drafter, form_batch asks it for drafts
// of every decoding sequence at once and sends each as one verification item [last token,
// drafts] (BatchItem::n_draft) in the same forward pass as the other decodes and prefill
// chunks; process_logits verifies them (verify_drafts), settles the engine and emits every
// accepted token plus one in one StreamEvent.
// A finished sequence's slot is refilled by admit() at the very next step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/speculation_governor.h"
#include "runtime/speculative.h"
#include "serve/api/output.h"
#include "serve/api/request.h"
#include "serve/metrics/metrics.h"
#include "serve/scheduling/channel.h"
#include "serve/structured/matcher.h"

namespace afd::serve {

// Scheduler-owned state of one request.
struct SeqRequest {
  SeqRequest(const GenerationRequest& g, const Tokenizer* tok, std::vector<int32_t> eos, double arrival_s);
  std::vector<int32_t> tokens;     // prompt + generated so far
  int64_t n_prompt = 0;
  int64_t n_computed = 0;          // tokens of `tokens` with KV in the engine
  // A continuation replaying generated tokens exactly (worker_resume.h): until n_computed
  // reaches this, the prompt is prefilled on its own and each generated token after it is
  // forwarded alone, as one decode step, so that their KV — and every later logit — is
  // computed as the original sequence computed it. 0: no such replay.
  int64_t replay_end = 0;
  int64_t seq_id = -1;             // engine sequence, -1 when not admitted
  // This step's verification item: the last token, then the drafts (n_draft of them).
  std::vector<int32_t> step_tokens;
  int64_t n_draft = 0;
  bool logprobs = false;
  // Structured outputs: the grammar's state after the generated tokens (absent: free text),
  // and this step's token masks, one per row of the request's item.
  std::optional<GrammarMatcher> grammar;
  std::vector<uint64_t> masks;
  Sampler sampler;
  OutputProcessor output;
  std::shared_ptr<RequestChannel> channel = std::make_shared<RequestChannel>();
  double t_arrival = 0, t_first = 0, t_last = 0;
};

struct SchedulerOptions {
  int64_t max_running = 64;        // sequences in one batch
  int64_t max_queue = 1024;        // waiting requests; more -> resource_exhausted (HTTP 429)
  int64_t max_batch_tokens = 1024; // tokens per forward pass (decodes + prefill chunks)
  // A forward pass that fails with unavailable or timeout (an AFD peer lost or stalled; the
  // engine leaves every sequence unchanged) is retried, once Engine::health() is ok again,
  // for up to this long before its requests fail; meanwhile they wait (streams pause).
  // 0: fail them at once. (--step-retry-s.)
  double step_retry_s = 30;
  // Speculative decoding with the scheduler's drafter: drafts per sequence and step (the
  // engine options' --draft-tokens); 0 or no drafter: none.
  int64_t draft_tokens = 0;
  // Drafts only in steps with at most this many decoding sequences (--speculative-max-batch); 0:
  // always; SpeculativeOptions::kMaxBatchAuto: as the scheduler's SpeculationGovernor measures.
  int64_t draft_max_batch = 0;
};

class Scheduler {
 public:
  // engine, stats, metrics and drafter must outlive the scheduler. metrics and drafter
  // (speculative decoding) may be null.
  Scheduler(Engine* engine, SchedulerOptions opt, WorkerStats* stats, Metrics* metrics, Drafter* drafter = nullptr);
  ~Scheduler();

  // Queues a request (thread-safe). resource_exhausted when the queue is full.
  Status submit(std::shared_ptr<SeqRequest> r);
  // Starts / stops the step thread. stop() fails all unfinished requests as cancelled.
  void start();
  void stop();

  // One iteration; returns the number of batch items run (0: nothing to do).
  Result<int> step();

  // --- named steps (scheduler thread only; public for unit tests) ---
  void drop_cancelled();
  // Moves waiting requests into the running set while slots and KV blocks allow; returns how many.
  int admit();
  // Items for the next forward; `order` receives the request of each item.
  std::vector<BatchItem> form_batch(std::vector<SeqRequest*>* order);
  // logits: [vocab] rows per item, in order (one, or one per token with all_logits); hidden:
  // the matching final-normed hidden rows when the drafter reads them, else empty.
  void process_logits(const std::vector<SeqRequest*>& order, const std::vector<BatchItem>& items,
                      const std::vector<float>& logits, const std::vector<float>& hidden = {});

  // The engine's health (Engine::health; thread-safe).
  Status engine_health() const { return engine_->health(); }
  int64_t n_waiting() const;
  // True once the step thread has found nothing waiting and nothing running, until the next
  // submit() (thread-safe). With submissions stopped, true means every request has finished.
  bool idle() const;
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }

 private:
  // Copies the governor's per-bucket choice and rates into stats_ (for /metrics).
  void publish_governor();
  // Frees r's engine sequence (and the drafter's); r->seq_id becomes -1.
  void release(SeqRequest* r);
  // Proposes this step's drafts for the decoding sequences (r->step_tokens, r->n_draft); a
  // constrained sequence's drafts end before the first one its grammar does not allow.
  void propose_drafts();
  // Fills r->masks for the rows of r's item (the grammar after 0, 1, .. n_draft of its drafts);
  // false when the grammar allows no token at all (the answer is complete).
  bool fill_masks(SeqRequest* r, const BatchItem& it);
  void finish(SeqRequest* r, FinishReason why, Status err = Status());
  void remove_finished();
  // After the attempt-th retryable failure of a batch that first failed at `t_fail`: pauses
  // (50 ms << attempt, at most 1 s), then waits until the engine is healthy (true) or the
  // retry budget is spent / the scheduler stops (false).
  bool wait_for_engine(double t_fail, int attempt);
  // Frees the newest running sequence other than `keep` that draws from keep's KV pool (freeing
  // another pool's blocks would not make room) and requeues it for recompute.
  bool preempt_one(const SeqRequest* keep);
  void publish_stats();

  Engine* engine_;
  SchedulerOptions opt_;
  WorkerStats* stats_;
  Metrics* metrics_;
  Drafter* drafter_;
  int64_t vocab_;
  // --speculative-max-batch auto: the governor, and what the current step asked of it and did
  // (set by propose_drafts and process_logits, recorded by step for pure decode steps).
  SpeculationGovernor governor_;
  int64_t step_decoding_ = 0;
  bool step_drafts_ = false;
  int64_t step_emitted_ = 0;

  mutable std::mutex mu_;                        // guards waiting_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<SeqRequest>> waiting_;
  bool stop_ = false;
  bool idle_ = true;                             // mu_; see idle()
  std::vector<std::shared_ptr<SeqRequest>> running_;  // scheduler thread only, admission order
  std::thread thread_;
};

}  // namespace afd::serve
