#include "runtime/ffn_backend.h"

#include <algorithm>

#include "core/check.h"
#include "core/timer.h"
#include "runtime/topology.h"

namespace afd {

void fp8_round_trip(float* h, int64_t n, int64_t hidden, int64_t group, std::vector<uint8_t>* q8,
                    std::vector<float>* scales) {
  if (group <= 0) group = hidden;
  const int64_t total = n * hidden;
  q8->resize(static_cast<size_t>(total));
  scales->resize(static_cast<size_t>(total / group));
  kernels::quantize_fp8_e4m3(h, total, group, q8->data(), scales->data());
  kernels::dequantize_fp8_e4m3(q8->data(), scales->data(), total, group, h);
}

LocalFfnBackend::LocalFfnBackend(std::shared_ptr<const ModelWeights> w, LocalFfnOptions opt, ThreadPool* pool)
    : w_(std::move(w)), opt_(std::move(opt)), pool_(pool) {}

Status LocalFfnBackend::dispatch(int64_t layer, int microbatch, TokenBatch& b) {
  const int64_t t0 = now_ns();
  const int64_t hid = w_->config.hidden_size;
  const float* h = b.h.data();
  if (opt_.fp8_dispatch) {
    hq_.assign(b.h.begin(), b.h.begin() + b.n * hid);
    fp8_round_trip(hq_.data(), b.n, hid, opt_.fp8_group, &q8_, &scales_);
    h = hq_.data();
  }
  if (opt_.combine_shards <= 0) {
    ffn_part(*w_, layer, h, b.n, b.topk_ids.data(), b.topk_w.data(), b.ffn_out.data(), opt_.part, &scratch_, pool_);
  } else {
    const int tp = opt_.combine_tp > 1 ? opt_.combine_tp : 1;
    AFD_CHECK(opt_.combine_shards % tp == 0 && (tp == 1 || static_cast<int>(opt_.tp_slices.size()) == tp),
              "LocalFfnBackend: combine_tp must divide combine_shards and come with its weight slices");
    const int64_t E = w_->config.n_experts, total = b.n * hid;
    partial_.resize(static_cast<size_t>(total));
    std::fill(b.ffn_out.begin(), b.ffn_out.begin() + total, 0.0f);
    for (int s = 0; s < opt_.combine_shards; ++s) {
      const ExpertRange r = ffn_shard_range(s, opt_.combine_shards, tp, E);
      const ModelWeights& ws = tp > 1 ? *opt_.tp_slices[static_cast<size_t>(r.tp_rank)] : *w_;
      FfnPartOptions po = opt_.part;
      po.experts_mask.assign(static_cast<size_t>(std::max<int64_t>(E, 1)), 0);
      for (int64_t e = r.begin; e < r.end; ++e) po.experts_mask[e] = 1;
      po.include_shared = r.holds_shared;
      ffn_part(ws, layer, h, b.n, b.topk_ids.data(), b.topk_w.data(), partial_.data(), po, &scratch_, pool_);
      for (int64_t i = 0; i < total; ++i) b.ffn_out[i] += round_bf16(partial_[i]);
    }
  }
  times_at(layer).ffn_s += (now_ns() - t0) * 1e-9;
  return Status();
}

}  // namespace afd
