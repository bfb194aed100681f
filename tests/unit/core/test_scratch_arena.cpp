// ScratchSlot: aligned, disjoint takes; frames give back what was taken inside them; blocks merge
// once nothing is live, so a repeated pattern reuses the same memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "core/check.h"
#include "core/scratch_arena.h"

namespace afd::test_scratch_arena {
namespace {

TEST(ScratchSlot, TakesAreAlignedAndDisjoint) {
  ScratchSlot s;
  ScratchSlot::Frame f(s);
  char* a = s.take<char>(3);
  float* b = s.take<float>(1000);
  double* c = s.take<double>(200000);  // past the first block
  for (const void* p : {static_cast<const void*>(a), static_cast<const void*>(b), static_cast<const void*>(c)})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(a, 1, 3);
  std::memset(b, 2, 1000 * sizeof(float));
  std::memset(c, 3, 200000 * sizeof(double));
  EXPECT_EQ(a[2], 1);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(b)[3999], 2);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(c)[0], 3);
}

TEST(ScratchSlot, FramesGiveBackAndTheSteadyStateReusesOneBlock) {
  ScratchSlot s;
  auto pattern = [&] {
    ScratchSlot::Frame outer(s);
    float* x = s.take<float>(100);
    const void* inner_first;
    {
      ScratchSlot::Frame inner(s);
      inner_first = s.take<float>(50000);
      s.take<float>(50000);
    }
    // The inner frame's memory is given back: the same take lands where it did inside it.
    EXPECT_EQ(static_cast<const void*>(s.take<float>(50000)), inner_first);
    return static_cast<const void*>(x);
  };
  pattern();               // grows into several blocks, merged at the end
  const void* first = pattern();
  EXPECT_EQ(pattern(), first);  // one block from now on: the same addresses every time
}

TEST(ScratchSlot, TakeOutsideAFrameIsAnError) {
  ScratchSlot s;
  EXPECT_THROW(s.take<float>(1), InternalError);
}

TEST(ScratchArena, OneSlotPerThreadIndex) {
  ScratchArena a(3);
  EXPECT_EQ(a.size(), 3);
  EXPECT_NE(&a.slot(0), &a.slot(2));
  EXPECT_THROW(a.slot(3), InternalError);
}

TEST(ScratchArena, ReserveSlotsOnlyGrows) {
  ScratchArena a;
  EXPECT_EQ(a.size(), 1);
  a.reserve_slots(4);
  EXPECT_EQ(a.size(), 4);
  {
    ScratchSlot::Frame f(a.slot(3));
    EXPECT_NE(a.slot(3).take<float>(16), nullptr);
  }
  a.reserve_slots(2);
  EXPECT_EQ(a.size(), 4);
  EXPECT_THROW(a.slot(4), InternalError);
}

}  // namespace
}  // namespace afd::test_scratch_arena
