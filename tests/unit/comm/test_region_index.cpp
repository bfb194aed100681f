// RegionIndex (comm/ucx/region_index.h): lookups of whole ranges, nesting, removal.
#include "comm/ucx/region_index.h"

#include <gtest/gtest.h>

#include <vector>

namespace afd::comm::ucx {
namespace {

void* h(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + i)); }

TEST(RegionIndex, FindsTheRangeThatHoldsTheWholeSpan) {
  std::vector<char> mem(1 << 16);
  char* b = mem.data();
  RegionIndex idx;
  idx.add(b + 0, 1024, 1, h(1));
  idx.add(b + 4096, 4096, 2, h(2));
  EXPECT_EQ(idx.find(b, 1024), h(1));
  EXPECT_EQ(idx.find(b + 1000, 24), h(1));
  EXPECT_EQ(idx.find(b + 1000, 25), nullptr);  // runs past its end
  EXPECT_EQ(idx.find(b + 2048, 8), nullptr);   // between ranges
  EXPECT_EQ(idx.find(b + 4096, 4096), h(2));
  EXPECT_EQ(idx.find(b + 8191, 1), h(2));
  EXPECT_EQ(idx.find(b + 8192, 1), nullptr);
}

TEST(RegionIndex, NestedRangesAndALargeOneFarBelow) {
  std::vector<char> mem(1 << 20);
  char* b = mem.data();
  RegionIndex idx;
  idx.add(b, 1 << 20, 1, h(1));       // covers everything
  idx.add(b + 65536, 256, 2, h(2));   // a small one inside, after it
  // Inside the small one: the highest base that holds the span.
  EXPECT_EQ(idx.find(b + 65536, 256), h(2));
  // Past the small one's end: the large range far below still holds it.
  EXPECT_EQ(idx.find(b + 65536 + 200, 1000), h(1));
  EXPECT_EQ(idx.find(b + 900000, 4096), h(1));
}

TEST(RegionIndex, RemoveNeedsBaseAndIdAndTakeAllEmpties) {
  std::vector<char> mem(8192);
  char* b = mem.data();
  RegionIndex idx;
  idx.add(b, 4096, 7, h(7));
  idx.add(b, 8192, 8, h(8));  // same base, another registration
  EXPECT_EQ(idx.remove(b, 9), nullptr);
  EXPECT_EQ(idx.remove(b + 1, 7), nullptr);
  EXPECT_EQ(idx.remove(b, 7), h(7));
  EXPECT_EQ(idx.remove(b, 7), nullptr);  // once
  EXPECT_EQ(idx.find(b + 5000, 10), h(8));
  std::vector<void*> all = idx.take_all();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], h(8));
  EXPECT_EQ(idx.find(b, 1), nullptr);
  EXPECT_TRUE(idx.take_all().empty());
}

}  // namespace
}  // namespace afd::comm::ucx
