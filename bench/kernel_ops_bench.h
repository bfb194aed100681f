// bench_kernels --ops: times every op of the kernel registry (tests/kernel_ops/kernel_ops.h).
#pragma once

#include <string>

namespace afd::bench {

// Prints a Markdown table, one row per op x shape: median and p90 over `rounds` rounds of the
// time per call of the dispatched kernel (pool of `threads`), its GB/s and GFLOP/s at the
// median, and the same for the scalar reference where one call is cheap (<= 1e8 FLOPs and
// bytes). filter: ops whose name contains it (empty: all); model: "default", "bench" or empty
// (both shape sets). Returns the process exit status.
int run_kernel_ops(int threads, int rounds, const std::string& filter, const std::string& model);

}  // namespace afd::bench
