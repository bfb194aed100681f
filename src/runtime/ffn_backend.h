// FfnBackend: where a layer's FFN half runs. The engine posts a micro-batch's FFN input
// with dispatch() and later collects ffn_out with combine(); between the two it is free to
// run attention for other micro-batches (the Figure-7 pipeline of the Step-3 paper).
//
// Contract: for every (layer, microbatch) dispatch() is called exactly once, followed by
// exactly one combine() on the same TokenBatch, which must stay alive and unmodified in
// h / topk_ids / topk_w in between. Calls come from the engine thread only.
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/ffn_part.h"
#include "model/token_batch.h"

namespace afd {

// One layer's FFN-side stage times (seconds, summed over micro-batches):
//   a2f_s: the attention side encoding and posting the A->F transfer (dispatch);
//   ffn_s: FFN compute (local: measured here; remote: reported by the FFN workers in the
//          reply header's ffn_us, the slowest worker of each micro-batch);
//   f2a_s: the attention side in combine: waiting for, decoding and adding the F->A
//          replies (what the pipeline did not hide).
struct FfnLayerTimes {
  double a2f_s = 0, ffn_s = 0, f2a_s = 0;
};

class FfnBackend {
 public:
  virtual ~FfnBackend() = default;
  virtual Status dispatch(int64_t layer, int microbatch, TokenBatch& b) = 0;
  // Fills b.ffn_out [n, hidden]. Errors: a peer lost, timed out or sent garbage.
  virtual Status combine(int64_t layer, int microbatch, TokenBatch& b) = 0;
  // Whether the backend can serve a forward pass now: ok, or unavailable naming what is
  // missing (e.g. a remote FFN worker that is not connected). Unlike the rest of this
  // interface, callable from any thread (health checks), concurrently with the engine.
  virtual Status health() const { return Status(); }
  // Per-layer times since the last reset_times() (one entry per layer seen).
  const std::vector<FfnLayerTimes>& layer_times() const { return times_; }
  void reset_times() { times_.clear(); }

 protected:
  FfnLayerTimes& times_at(int64_t layer) {
    if (static_cast<size_t>(layer) >= times_.size()) times_.resize(static_cast<size_t>(layer) + 1);
    return times_[static_cast<size_t>(layer)];
  }

 private:
  std::vector<FfnLayerTimes> times_;
};

// Runs ffn_part in the calling thread at dispatch() (monolithic wiring). With
// fp8_dispatch, h is rounded exactly as the AFD wire would round it (FP8 e4m3 with
// per-token or per-128-block scales), so monolithic and AFD outputs can be compared.
struct LocalFfnOptions {
  FfnPartOptions part;
  bool fp8_dispatch = false;
  int64_t fp8_group = 0;  // 0: per token (group = hidden); else channels per scale (e.g. 128)
  // > 0: also reproduce the BF16 combine of an xAyF bundle with y = combine_shards: each
  // FFN shard's partial sum (runtime/topology.h ranges, shared expert in shard 0) is rounded
  // to BF16 and the partials are added in f32 in shard order, exactly as FfnClient does.
  int combine_shards = 0;
  // With combine_shards = y > 0 and TP degree t > 1 (dividing y): reproduce an xAyF bundle
  // with --ffn-tp t instead — shard s is TP rank s % t of EP group s / t (runtime/topology.h);
  // its partial (computed from tp_slices[s % t]) is rounded to BF16 and added in f32 in
  // shard order, exactly as FfnClient adds the workers' replies.
  int combine_tp = 1;
  // [t] slice_ffn_tp(w, rank r of t, every expert, shared included); required when combine_tp > 1.
  std::vector<std::shared_ptr<const ModelWeights>> tp_slices;
};

class LocalFfnBackend : public FfnBackend {
 public:
  LocalFfnBackend(std::shared_ptr<const ModelWeights> w, LocalFfnOptions opt, ThreadPool* pool);
  Status dispatch(int64_t layer, int microbatch, TokenBatch& b) override;
  Status combine(int64_t layer, int microbatch, TokenBatch& b) override { return Status(); }

 private:
  std::shared_ptr<const ModelWeights> w_;
  LocalFfnOptions opt_;
  ThreadPool* pool_;
  FfnScratch scratch_;
  std::vector<float> hq_;       // [n, hidden] fp8-rounded copy of h
  std::vector<uint8_t> q8_;
  std::vector<float> scales_;
  std::vector<float> partial_;  // [n, hidden] one shard's output (combine_shards > 0)
};

// Rounds h [n, hidden] in place through FP8 e4m3 with one scale per `group` channels —
// exactly what an AFD dispatch does to the activations on the wire.
void fp8_round_trip(float* h, int64_t n, int64_t hidden, int64_t group, std::vector<uint8_t>* q8,
                    std::vector<float>* scales);

}  // namespace afd
