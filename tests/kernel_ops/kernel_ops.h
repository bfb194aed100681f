// The registry of CPU kernel ops that both the kernel test (tests/unit/kernels/test_kernel_ops.cpp:
// every op x test shape x ISA level against its scalar reference) and `bench_kernels --ops`
// (bench/kernel_ops_bench.cpp) iterate. An op is one kernel of src/kernels/cpu with a scalar
// reference, in one configuration (weight dtype, activation precision, order): its shapes, a
// setup that makes deterministic inputs, the dispatched call, the reference call, the bound the
// kernel is held to and its bytes / FLOPs per call. A new kernel is added by registering it:
// one factory in its family's file (ops_*.cpp), listed in kernel_ops() (kernel_ops.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/scratch_arena.h"
#include "core/thread_pool.h"

namespace afd::kernels::ops {

// One shape of an op: its dimensions in the op's own order (each op's factory names them) and a
// label that prints them ("n=1 rows=192 cols=256").
struct Shape {
  std::string label;
  std::vector<int64_t> d;
  int64_t operator[](size_t i) const { return d[i]; }
};
// Shape{"n=1 rows=192 cols=256", {1, 192, 256}} from ({"n", 1}, {"rows", 192}, {"cols", 256}).
Shape shape(std::initializer_list<std::pair<const char*, int64_t>> dims);

// One op at one shape, inputs made at construction (fixed seeds: the same bits every run).
// Outputs are compared flattened to f32 values: got() after run(), want() after reference(), of
// equal length, including padding the kernel must leave alone (row strides wider than rows);
// integer outputs (bf16 / fp8 codes) as their integer values.
class OpCase {
 public:
  virtual ~OpCase() = default;
  // Restores what run() overwrites in place (inputs of in-place ops, accumulated outputs, padding
  // sentinels). The test calls it before every run(); the bench once per round, so a case's
  // run() repeated on its own output stays finite and in the normal range.
  virtual void reset() = 0;
  // The dispatched kernel at the active ISA level (set_isa_limit), into got(). pool may be null.
  virtual void run(ThreadPool* pool) = 0;
  // The scalar reference (afd::kernels::ref, one thread), into want().
  virtual void reference() = 0;
  virtual std::vector<float> got() const = 0;
  virtual std::vector<float> want() const = 0;
  // Per output element, the largest |got - want| allowed for the last run() (it may depend on
  // the path that run took at the ISA level active then); 0: bit-identical.
  virtual std::vector<double> bounds() const = 0;
  // Memory touched and arithmetic done per run() call, for GB/s and GFLOP/s.
  double bytes = 0, flops = 0;

 protected:
  // The kernels' working memory for a call over `pool` (null: the calling thread alone): an
  // arena of at least pool->size() slots, kept between calls so that repeated runs allocate
  // nothing. The case owns it, as the model parts own theirs.
  ScratchArena& scratch(ThreadPool* pool) {
    arena_.reserve_slots(pool ? pool->size() : 1);
    return arena_;
  }

 private:
  ScratchArena arena_;
};

struct KernelOp {
  std::string name;       // "linear bf16w bf16act"
  std::string tolerance;  // the bound, in words (the test prints it with a failure)
  std::vector<Shape> test_shapes;
  // The default model's shapes (wordnet-dsv3: hidden 256, experts [192, 256], 4 MLA heads of
  // latent 64 + rope 32), then the bench model's (make-model --preset bench, qwen3_moe: hidden
  // 2048, experts [512, 2048], 32 query / 4 KV heads of 128).
  std::vector<Shape> default_model_shapes, bench_model_shapes;
  std::function<std::unique_ptr<OpCase>(const Shape&)> make;
};

// Every registered op, in a fixed order.
const std::vector<KernelOp>& kernel_ops();

// The worst element of a comparison: index, values, bound; ok when every element is within its
// bound (bit-identical where the bound is 0).
struct Comparison {
  bool ok = true;
  int64_t n_bad = 0;
  int64_t worst = -1;  // the element furthest past its bound (or with the largest |got - want|)
  float got = 0, want = 0;
  double bound = 0;
};
Comparison compare(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& bounds);

// The families' factories (ops_elementwise.cpp, ops_linear.cpp, ops_attention.cpp).
void add_elementwise_ops(std::vector<KernelOp>& ops);
void add_linear_ops(std::vector<KernelOp>& ops);
void add_attention_ops(std::vector<KernelOp>& ops);

}  // namespace afd::kernels::ops
