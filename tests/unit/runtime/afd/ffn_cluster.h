// In-process FFN workers for runtime tests: worker j is "ffn<j>" listening at "ffn<j>-addr" on
// one InprocHub, each on its own thread. kill(j) ends one as its process dying would (its
// transport closes); start(j, ...) may start it again under the same name and address.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/fault_transport.h"
#include "comm/inproc_transport.h"
#include "core/timer.h"
#include "model/token_batch.h"
#include "model/weights.h"
#include "runtime/afd/ffn_worker.h"

namespace afd::test {

// n tokens of a top-2 model: normal hidden states from seed, two distinct random experts each
// with weights 0.7 / 0.3.
inline TokenBatch random_batch(const ModelConfig& c, int64_t n, uint32_t seed) {
  TokenBatch b;
  b.resize(c, n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  for (auto& v : b.h) v = nd(rng);
  const int64_t K = c.n_experts_per_tok;
  for (int64_t i = 0; i < n; ++i) {
    int32_t e0 = static_cast<int32_t>(rng() % c.n_experts);
    int32_t e1 = static_cast<int32_t>((e0 + 1 + rng() % (c.n_experts - 1)) % c.n_experts);
    b.topk_ids[i * K] = e0;
    b.topk_ids[i * K + 1] = e1;
    b.topk_w[i * K] = 0.7f;
    b.topk_w[i * K + 1] = 0.3f;
  }
  return b;
}

inline int64_t deadline_in_ms(int64_t ms) { return now_ns() + ms * 1000000; }

// Polls f every 5 ms until it holds (true) or ms pass (false).
inline bool wait_until(const std::function<bool()>& f, int64_t ms = 10000) {
  const int64_t dl = deadline_in_ms(ms);
  while (!f()) {
    if (now_ns() > dl) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

struct FfnCluster {
  struct Ffn {
    std::unique_ptr<comm::Transport> t;
    comm::FaultTransport* fault = nullptr;  // when started with fault_wrap
    std::unique_ptr<FfnWorker> wk;
    std::atomic<bool> stop{false};
    std::thread th;
  };
  explicit FfnCluster(std::shared_ptr<const ModelWeights> w) : w(std::move(w)) {}
  ~FfnCluster() {
    for (size_t j = 0; j < ffn.size(); ++j) kill(static_cast<int>(j));
  }
  // Starts FFN worker j with options o (o.index is set to j); fault_wrap puts a
  // FaultTransport (seed 17) around its transport.
  void start(int j, FfnWorkerOptions o, bool fault_wrap = false) {
    if (ffn.size() <= static_cast<size_t>(j)) ffn.resize(static_cast<size_t>(j) + 1);
    auto f = std::make_unique<Ffn>();
    auto t = comm::InprocTransport::create(hub, "ffn" + std::to_string(j));
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    f->t = std::move(t).value();
    if (fault_wrap) {
      auto ft = std::make_unique<comm::FaultTransport>(std::move(f->t), 17);
      f->fault = ft.get();
      f->t = std::move(ft);
    }
    ASSERT_TRUE(f->t->listen("ffn" + std::to_string(j) + "-addr").is_ok());
    o.index = j;
    auto wk = FfnWorker::create(w, f->t.get(), o, nullptr);
    ASSERT_TRUE(wk.ok()) << wk.status().to_string();
    f->wk = std::move(wk).value();
    Ffn* raw = f.get();
    f->th = std::thread([raw] { (void)raw->wk->run(&raw->stop); });
    ffn[static_cast<size_t>(j)] = std::move(f);
  }
  void kill(int j) {
    auto& f = ffn[static_cast<size_t>(j)];
    if (!f) return;
    f->stop = true;
    f->th.join();
    f->wk.reset();
    f->t->close();
    f.reset();
  }
  // An attention side's transport on the same hub (kept alive by the cluster).
  comm::Transport* attention(const std::string& name) {
    auto t = comm::InprocTransport::create(hub, name);
    EXPECT_TRUE(t.ok());
    attn.push_back(std::move(t).value());
    return attn.back().get();
  }
  std::shared_ptr<const ModelWeights> w;
  std::shared_ptr<comm::InprocHub> hub = std::make_shared<comm::InprocHub>();
  std::vector<std::unique_ptr<Ffn>> ffn;
  std::vector<std::unique_ptr<comm::Transport>> attn;
};

}  // namespace afd::test
