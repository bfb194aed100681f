// SpeculationGovernor: whether a decode step should propose drafts (--speculative-max-batch
// auto), measured while decoding instead of set by hand. Drafts pay at small batches, where a
// step reads the weights for few tokens, and stop paying at larger ones, where verifying them
// costs compute (docs/BENCHMARKS.md "Speculative decoding"); where that happens depends on the
// model, the machine, the drafter and the text. The governor keeps, per batch-size bucket (the
// number of decoding sequences: 1, 2, 3-4, 5-8, ..., 65+), the tokens per second of the steps
// run with drafts and of those run without (moving averages of tokens and of seconds per step,
// divided: the rate of the steps together, not an average of each step's rate, which long
// steps would weigh too little), tries each side
// `warmup` times first, then runs the faster side, and every `explore_every`-th step of a bucket
// the other one, so a change in the text or the load is seen. Drafts never change what is
// generated (verification is exact under greedy and keeps the distribution under sampling),
// so switching between steps is safe. No clock: the caller measures each step.
// Not thread-safe: one per decode loop (a scheduler's thread, generate()).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace afd {

class SpeculationGovernor {
 public:
  struct Options {
    int64_t warmup = 4;          // steps of each side per bucket before choosing, >= 1
    int64_t explore_every = 16;  // then every this many steps the other side, >= 2
    double smoothing = 0.2;      // weight of a new step in the moving average, (0, 1]
  };
  static constexpr int kBuckets = 8;

  SpeculationGovernor() = default;
  explicit SpeculationGovernor(Options o) : opt_(o) {}

  // Whether the next decode step of n_decoding sequences proposes drafts.
  bool use_drafts(int64_t n_decoding);
  // A decode step of n_decoding sequences (no prompt tokens in it) that ran with drafts or
  // without, took `seconds` from proposing to the last token sampled, and emitted `tokens`.
  // Steps with seconds <= 0 are ignored.
  void record(int64_t n_decoding, bool drafts, double seconds, int64_t tokens);

  static int bucket(int64_t n_decoding);  // 0: 1, 1: 2, 2: 3-4, ..., 7: 65 and more
  static const char* bucket_name(int b);  // "1", "2", "3-4", ..., "65+"
  // The side a bucket runs when not exploring: +1 drafts, -1 no drafts, 0 still warming up.
  int preferred(int b) const;
  double rate(int b, bool drafts) const { return buckets_[static_cast<size_t>(b)].side[drafts ? 1 : 0].rate(); }
  // "1:on 2:on 3-4:off ..." for the buckets that have a preference; for logs and metrics.
  std::string summary() const;

 private:
  struct Side {
    double tokens = 0, seconds = 0;  // per step, moving averages
    int64_t samples = 0;
    double rate() const { return seconds > 0 ? tokens / seconds : 0.0; }
  };
  struct Bucket {
    Side side[2];  // [0]: without drafts, [1]: with
    int64_t steps = 0;
  };
  Options opt_;
  std::array<Bucket, kBuckets> buckets_{};
};

}  // namespace afd
