// machine_limits: small, fast runs of each measurement; the values must be positive, finite
// and physically plausible (a 2-thread read of 64 MiB between 0.1 GB/s and 10 TB/s).
#include <gtest/gtest.h>

#include <cmath>

#include "core/thread_pool.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/machine_limits.h"

namespace afd::kernels::test_machine_limits {
namespace {

TEST(MachineLimits, ReadAndCopyBandwidthArePlausible) {
  ThreadPool pool(2);
  double rd = measure_read_bandwidth(pool, size_t{64} << 20, 1);
  double cp = measure_copy_bandwidth(pool, size_t{64} << 20, 1);
  EXPECT_TRUE(std::isfinite(rd) && std::isfinite(cp));
  EXPECT_GT(rd, 1e8);
  EXPECT_LT(rd, 1e13);
  EXPECT_GT(cp, 1e8);
  EXPECT_LT(cp, 1e13);
}

TEST(MachineLimits, GemmAndPeakRatesArePlausible) {
  ThreadPool pool(2);
  double g32 = measure_gemm_flops(pool, DType::f32, 64, 128, 256, 1);
  double gbf = measure_gemm_flops(pool, DType::bf16, 64, 128, 256, 1);
  EXPECT_GT(g32, 1e8);
  EXPECT_GT(gbf, 1e8);
  EXPECT_LT(g32, 1e14);
  if (detected_isa() != Isa::scalar) {
    double peak = measure_peak_flops(pool, DType::f32);
    EXPECT_GT(peak, 1e9);
    EXPECT_LT(peak, 1e14);
  }
}

}  // namespace
}  // namespace afd::kernels::test_machine_limits
