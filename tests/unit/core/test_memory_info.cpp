// available_memory_bytes: MemAvailable of /proc/meminfo, within what the machine has.
#include "core/memory_info.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace afd::test_memory_info {
namespace {

TEST(MemoryInfo, AvailableIsPositiveAndAtMostPhysicalMemory) {
  const int64_t avail = available_memory_bytes();
#ifdef __linux__
  ASSERT_GT(avail, 0);
  const int64_t total = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  EXPECT_LE(avail, total);
#else
  EXPECT_TRUE(avail == -1 || avail > 0);
#endif
}

}  // namespace
}  // namespace afd::test_memory_info
