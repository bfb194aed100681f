#include "plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>
#include <vector>

#include "plan/rng.h"

namespace afd::plan {

const char* length_dist_name(LengthDistKind k) {
  switch (k) {
    case LengthDistKind::fixed: return "fixed";
    case LengthDistKind::geometric: return "geometric";
    case LengthDistKind::uniform: return "uniform";
  }
  return "?";
}

Result<LengthDistKind> parse_length_dist(const std::string& name) {
  if (name == "fixed") return LengthDistKind::fixed;
  if (name == "geometric" || name == "geo") return LengthDistKind::geometric;
  if (name == "uniform") return LengthDistKind::uniform;
  return invalid_argument("unknown length distribution '" + name + "' (fixed, geometric, uniform)");
}

Status SimConfig::validate() const {
  if (n_attn < 1 || n_ffn < 1) return invalid_argument("sim: need at least one attention and one FFN instance");
  if (batch < 1) return invalid_argument("sim: batch must be >= 1");
  if (n_microbatches < 1) return invalid_argument("sim: n_microbatches must be >= 1");
  if (n_layers < 1) return invalid_argument("sim: n_layers must be >= 1");
  if (requests_per_attn < 1) return invalid_argument("sim: requests must be >= 1");
  if (n_attn > 100000 || n_attn * n_microbatches * batch > 100000000)
    return invalid_argument("sim: bundle too large (attention instances * micro-batches * batch > 1e8)");
  if (n_attn * requests_per_attn > 4000000000LL) return invalid_argument("sim: too many requests (> 4e9)");
  for (const auto* d : {&prefill, &decode}) {
    const char* which = d == &prefill ? "prefill" : "decode";
    if (!(d->mean >= 0) || !std::isfinite(d->mean) || d->mean > 1e9)
      return invalid_argument(std::string("sim: ") + which + " mean must be in [0, 1e9]");
    if (d->kind == LengthDistKind::uniform && !(d->spread >= 0 && d->spread <= 1))
      return invalid_argument(std::string("sim: ") + which + " uniform spread must be in [0, 1]");
  }
  if (!(stable_fraction > 0 && stable_fraction <= 1)) return invalid_argument("sim: stable fraction must be in (0, 1]");
  Status st = latency.validate();
  if (!st.is_ok()) return st.with_context("sim latency profile");
  st = experts.validate(n_ffn);
  if (!st.is_ok()) return st.with_context("sim expert load");
  return Status();
}

namespace {

int64_t draw_length(Rng& rng, const LengthDist& d) {
  switch (d.kind) {
    case LengthDistKind::fixed: return std::llround(d.mean);
    case LengthDistKind::geometric: return rng.geometric(1.0 / (1.0 + d.mean));
    case LengthDistKind::uniform: {
      const int64_t lo = std::llround(d.mean * (1.0 - d.spread));
      const int64_t hi = std::llround(d.mean * (1.0 + d.spread));
      return rng.uniform_int(lo, hi);
    }
  }
  return 0;
}

// Fixed-capacity FIFO of small integers.
class Ring {
 public:
  void init(size_t cap) { buf_.assign(cap, 0); }
  bool empty() const { return size_ == 0; }
  void push(int64_t v) {
    buf_[(head_ + size_) % buf_.size()] = v;
    ++size_;
  }
  int64_t pop() {
    const int64_t v = buf_[head_];
    head_ = (head_ + 1) % buf_.size();
    --size_;
    return v;
  }

 private:
  std::vector<int64_t> buf_;
  size_t head_ = 0, size_ = 0;
};

enum EventType : uint8_t { kAttnDone, kLinkDone, kFfnDone };

struct Event {
  double t;
  uint64_t seq;  // tie-break: schedule order, so runs are deterministic
  uint8_t type;
  int64_t a;     // micro-batch id (attn/link) or group (ffn)
  int64_t dir;   // link: 0 = A->F, 1 = F->A
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct Req {
  int64_t end_step;   // the micro-batch step after which it finishes
  double admit_time;
  int64_t tokens;     // D
  int64_t load_term;  // s - admit_step: its load at step k is load_term + k
  bool operator>(const Req& o) const { return end_step > o.end_step; }
};

struct MicroBatch {
  int64_t inst = 0, group = 0;
  int64_t n_active = 0;
  int64_t load_base = 0;  // Σ (s_b - admit_step_b); T = load_base + n_active * step
  int64_t step = 0;
  int64_t layer = 0;
  bool live = true;
  std::vector<Req> heap;  // min-heap on end_step
  int64_t token_load() const { return load_base + n_active * step; }
};

class Sim {
 public:
  // ffn_imbalance: [n_profiles] FFN max/mean per expert profile, empty when the model is off.
  Sim(const SimConfig& c, std::vector<double> ffn_imbalance)
      : c_(c), rng_(c.seed), ffn_imbalance_(std::move(ffn_imbalance)) {}

  SimResult run() {
    const int64_t x = c_.n_attn, m = c_.n_microbatches;
    res_.n_requests = x * c_.requests_per_attn;
    res_.n_stable = static_cast<int64_t>(std::ceil(c_.stable_fraction * static_cast<double>(res_.n_requests) - 1e-9));
    res_.n_stable = std::clamp<int64_t>(res_.n_stable, 1, res_.n_requests);
    mbs_.resize(x * m);
    attn_q_.resize(x);
    link_q_.resize(x);
    attn_busy_.assign(x, 0);
    link_busy_.assign(x, 0);
    attn_busy_total_.assign(x, 0.0);
    attn_cur_end_.assign(x, 0.0);
    for (auto& q : attn_q_) q.init(m);
    for (auto& q : link_q_) q.init(2 * m);
    ffn_q_.init(m);
    arrived_.assign(m, 0);
    live_.assign(m, 0);
    // Initial fill: micro-batch-major, then instance, from the FCFS stream.
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t i = 0; i < x; ++i) {
        MicroBatch& mb = mbs_[i * m + j];
        mb.inst = i;
        mb.group = j;
        mb.heap.reserve(c_.batch);
        fill(mb, 0.0);
      }
    }
    for (int64_t i = 0; i < x; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        MicroBatch& mb = mbs_[i * m + j];
        if (mb.n_active == 0) {
          mb.live = false;
          continue;
        }
        ++live_[j];
        enqueue_attn(i * m + j, 0.0);
      }
    }
    while (!events_.empty() && res_.n_completed < res_.n_requests) {
      const Event e = events_.top();
      events_.pop();
      ++res_.events;
      now_ = e.t;
      switch (e.type) {
        case kAttnDone: on_attn_done(e.a); break;
        case kLinkDone: on_link_done(e.a, e.dir); break;
        case kFfnDone: on_ffn_done(e.a); break;
      }
    }
    res_.t_end = now_;
    if (stable_snapshot_taken_ && res_.t_stable > 0) {
      res_.throughput_per_instance =
          res_.tokens_stable / res_.t_stable / static_cast<double>(c_.n_attn + c_.n_ffn);
    }
    res_.tpot = tpot_n_ > 0 ? tpot_sum_ / static_cast<double>(tpot_n_) : 0.0;
    const double L = static_cast<double>(c_.n_layers);
    auto mean = [](double sum, int64_t n) { return n > 0 ? sum / static_cast<double>(n) : 0.0; };
    res_.step_attn_time = L * mean(step_.attn_t, step_.attn_n);
    res_.step_active = mean(step_.active, step_.attn_n);
    res_.step_ffn_time = L * mean(step_.ffn_t, step_.ffn_n);
    res_.step_ffn_tokens = mean(step_.ffn_tokens, step_.ffn_n);
    res_.step_comm_time = 2.0 * L * mean(step_.comm_t, step_.comm_n);
    res_.mean_token_load = attn_runs_ > 0 ? load_sum_ / static_cast<double>(attn_runs_) : 0.0;
    if (stable_snapshot_taken_ && res_.t_stable > 0) {
      res_.mean_token_load_stable = attn_runs_stable_ > 0 ? load_sum_stable_ / static_cast<double>(attn_runs_stable_) : 0.0;
      res_.generated_throughput_per_instance =
          res_.tokens_generated_stable / res_.t_stable / static_cast<double>(c_.n_attn + c_.n_ffn);
    }
    return res_;
  }

 private:
  void push_event(double t, uint8_t type, int64_t a, int64_t dir = 0) { events_.push({t, seq_++, type, a, dir}); }

  // Draws the next request of the global stream; false when the stream is exhausted.
  bool next_request(int64_t* s, int64_t* d) {
    if (drawn_ >= res_.n_requests) return false;
    ++drawn_;
    *s = draw_length(rng_, c_.prefill);
    *d = draw_length(rng_, c_.decode);
    return true;
  }

  void complete(int64_t tokens, double admit_time) {
    ++res_.n_completed;
    res_.total_tokens += static_cast<double>(tokens);
    if (tokens > 0) {
      tpot_sum_ += (now_ - admit_time) / static_cast<double>(tokens);
      ++tpot_n_;
    }
    if (res_.n_completed == res_.n_stable) {
      res_.t_stable = now_;
      res_.tokens_stable = res_.total_tokens;
      res_.tokens_generated_stable = tokens_generated_;
      load_sum_stable_ = load_sum_;
      attn_runs_stable_ = attn_runs_;
      snapshot_idle();
    }
  }

  // Refills free slots of mb at time now_; its next step is mb.step.
  void fill(MicroBatch& mb, double now) {
    while (mb.n_active < c_.batch) {
      int64_t s = 0, d = 0;
      if (!next_request(&s, &d)) break;
      if (d <= 0) {  // finishes at admission: no decode step
        complete(0, now);
        continue;
      }
      mb.heap.push_back({mb.step + d - 1, now, d, s - mb.step});
      std::push_heap(mb.heap.begin(), mb.heap.end(), std::greater<Req>());
      mb.load_base += s - mb.step;
      ++mb.n_active;
    }
  }

  void snapshot_idle() {
    stable_snapshot_taken_ = true;
    const double t = now_;
    if (t <= 0) return;
    double idle_a = 0;
    for (int64_t i = 0; i < c_.n_attn; ++i) {
      const double busy = attn_busy_total_[i] - std::max(0.0, attn_cur_end_[i] - t);
      idle_a += (t - busy) / t;
    }
    res_.eta_attn = idle_a / static_cast<double>(c_.n_attn);
    const double busy_f = ffn_busy_total_ - std::max(0.0, ffn_cur_end_ - t);
    res_.eta_ffn = (t - busy_f) / t;
  }

  void enqueue_attn(int64_t id, double) {
    const int64_t i = mbs_[id].inst;
    attn_q_[i].push(id);
    if (!attn_busy_[i]) start_attn(i);
  }

  void start_attn(int64_t i) {
    if (attn_q_[i].empty()) return;
    const int64_t id = attn_q_[i].pop();
    const MicroBatch& mb = mbs_[id];
    const double load = static_cast<double>(mb.token_load());
    const double dur = c_.latency.attention.at(load) / static_cast<double>(c_.n_layers);
    if (!stable_snapshot_taken_) {
      step_.attn_t += dur;
      step_.active += static_cast<double>(mb.n_active);
      ++step_.attn_n;
    }
    load_sum_ += load;
    ++attn_runs_;
    attn_busy_[i] = 1;
    attn_busy_total_[i] += dur;
    attn_cur_end_[i] = now_ + dur;
    push_event(now_ + dur, kAttnDone, id);
  }

  void on_attn_done(int64_t id) {
    const int64_t i = mbs_[id].inst;
    attn_busy_[i] = 0;
    start_attn(i);
    enqueue_link(id, 0);
  }

  // Links: full duplex -> each direction its own pure delay per transfer (no contention);
  // half duplex -> one FIFO server per instance for both directions.
  void enqueue_link(int64_t id, int64_t dir) {
    const MicroBatch& mb = mbs_[id];
    const double dur = 0.5 * c_.latency.comm.at(static_cast<double>(mb.n_active)) / static_cast<double>(c_.n_layers);
    if (!stable_snapshot_taken_) {
      step_.comm_t += dur;
      ++step_.comm_n;
    }
    if (c_.full_duplex) {
      push_event(now_ + dur, kLinkDone, id, dir);
      return;
    }
    const int64_t i = mb.inst;
    link_q_[i].push(id * 2 + dir);
    if (!link_busy_[i]) start_link(i);
  }

  void start_link(int64_t i) {
    if (link_q_[i].empty()) return;
    const int64_t v = link_q_[i].pop();
    const int64_t id = v / 2, dir = v % 2;
    const double dur =
        0.5 * c_.latency.comm.at(static_cast<double>(mbs_[id].n_active)) / static_cast<double>(c_.n_layers);
    link_busy_[i] = 1;
    push_event(now_ + dur, kLinkDone, id, dir);
  }

  void on_link_done(int64_t id, int64_t dir) {
    if (!c_.full_duplex) {
      const int64_t i = mbs_[id].inst;
      link_busy_[i] = 0;
      start_link(i);
    }
    if (dir == 0) {
      const int64_t j = mbs_[id].group;
      if (++arrived_[j] == live_[j]) group_ready(j);
    } else {
      after_layer(id);
    }
  }

  void group_ready(int64_t j) {
    ffn_q_.push(j);
    if (!ffn_busy_) start_ffn();
  }

  void start_ffn() {
    if (ffn_q_.empty()) return;
    const int64_t j = ffn_q_.pop();
    arrived_[j] = 0;
    int64_t n = 0, layer = 0;  // every live micro-batch of the group is at the same layer
    for (int64_t i = 0; i < c_.n_attn; ++i) {
      const MicroBatch& mb = mbs_[i * c_.n_microbatches + j];
      if (!mb.live) continue;
      n += mb.n_active;
      layer = mb.layer;
    }
    double per_ffn = static_cast<double>(n) / static_cast<double>(c_.n_ffn);
    const double mean_per_ffn = per_ffn;
    if (!ffn_imbalance_.empty()) per_ffn *= ffn_imbalance_[static_cast<size_t>(layer) % ffn_imbalance_.size()];
    const double dur = c_.latency.ffn.at(per_ffn) / static_cast<double>(c_.n_layers);
    if (!stable_snapshot_taken_) {
      step_.ffn_t += dur;
      step_.ffn_tokens += mean_per_ffn;
      ++step_.ffn_n;
    }
    ffn_busy_ = true;
    ffn_busy_total_ += dur;
    ffn_cur_end_ = now_ + dur;
    push_event(now_ + dur, kFfnDone, j);
  }

  void on_ffn_done(int64_t j) {
    ffn_busy_ = false;
    start_ffn();
    for (int64_t i = 0; i < c_.n_attn; ++i) {
      const int64_t id = i * c_.n_microbatches + j;
      if (mbs_[id].live) enqueue_link(id, 1);
    }
  }

  void after_layer(int64_t id) {
    MicroBatch& mb = mbs_[id];
    if (++mb.layer < c_.n_layers) {
      enqueue_attn(id, now_);
      return;
    }
    mb.layer = 0;
    end_step(mb);
    if (mb.n_active == 0) {  // stream exhausted: the micro-batch retires
      mb.live = false;
      const int64_t j = mb.group;
      --live_[j];
      if (live_[j] > 0 && arrived_[j] == live_[j]) group_ready(j);
      return;
    }
    enqueue_attn(id, now_);
  }

  // The step mb.step has finished for every active slot: one token each; requests whose
  // end_step is this step leave; free slots are refilled for step + 1.
  void end_step(MicroBatch& mb) {
    ++res_.steps;
    tokens_generated_ += static_cast<double>(mb.n_active);
    const int64_t k = mb.step;
    while (!mb.heap.empty() && mb.heap.front().end_step == k) {
      std::pop_heap(mb.heap.begin(), mb.heap.end(), std::greater<Req>());
      const Req r = mb.heap.back();
      mb.heap.pop_back();
      mb.load_base -= r.load_term;
      --mb.n_active;
      complete(r.tokens, r.admit_time);
    }
    mb.step = k + 1;
    fill(mb, now_);
  }

  const SimConfig& c_;
  Rng rng_;
  std::vector<double> ffn_imbalance_;
  SimResult res_;
  std::vector<MicroBatch> mbs_;
  std::vector<Ring> attn_q_, link_q_;
  std::vector<uint8_t> attn_busy_, link_busy_;
  std::vector<double> attn_busy_total_, attn_cur_end_;
  // Sums of what a deployment measures per execution (SimResult::step_*), before T_80%; times
  // per layer (a step's is L times the mean).
  struct StepSums {
    double attn_t = 0, active = 0, ffn_t = 0, ffn_tokens = 0, comm_t = 0;
    int64_t attn_n = 0, ffn_n = 0, comm_n = 0;
  } step_;
  Ring ffn_q_;
  bool ffn_busy_ = false;
  double ffn_busy_total_ = 0, ffn_cur_end_ = 0;
  std::vector<int64_t> arrived_, live_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  double now_ = 0;
  int64_t drawn_ = 0;
  double tpot_sum_ = 0;
  int64_t tpot_n_ = 0;
  double load_sum_ = 0, load_sum_stable_ = 0;
  int64_t attn_runs_ = 0, attn_runs_stable_ = 0;
  double tokens_generated_ = 0;
  bool stable_snapshot_taken_ = false;
};

}  // namespace

Result<SimResult> simulate(const SimConfig& cfg) {
  AFD_RETURN_IF_ERROR(cfg.validate());
  std::vector<double> ffn_imbalance;
  ExpertImbalance imbalance;
  if (cfg.experts.enabled()) {
    AFD_ASSIGN_OR_RETURN(imbalance, expert_imbalance(cfg.experts, cfg.n_ffn, cfg.n_layers, cfg.seed));
    ffn_imbalance = imbalance.profile_max_over_mean;
  }
  Sim sim(cfg, std::move(ffn_imbalance));
  SimResult r = sim.run();
  r.ffn_imbalance_mean = imbalance.mean;
  r.ffn_imbalance_max = imbalance.max;
  return r;
}

}  // namespace afd::plan
