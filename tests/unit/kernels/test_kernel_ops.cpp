// Every op of the kernel registry (tests/kernel_ops/kernel_ops.h) at each of its test shapes, at
// every ISA level this CPU has, with and without a pool, against its scalar reference, held to
// the op's bound (KernelOp::tolerance). One test per op.
#include <gtest/gtest.h>

#include <cctype>
#include <iomanip>
#include <set>
#include <sstream>
#include <string>

#include "core/thread_pool.h"
#include "kernel_ops.h"
#include "kernels/cpu/isa.h"
#include "test_util.h"

namespace afd::kernels::ops {
namespace {

class KernelOps : public ::testing::TestWithParam<size_t> {};

TEST_P(KernelOps, MatchesReferenceAtEveryIsaLevel) {
  const KernelOp& op = kernel_ops()[GetParam()];
  ThreadPool pool(2);
  for (const Shape& s : op.test_shapes) {
    std::unique_ptr<OpCase> c = op.make(s);
    c->reset();
    c->reference();
    const std::vector<float> want = c->want();
    for (Isa isa : testing::isa_levels()) {
      testing::IsaLimitGuard guard(isa);
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
        c->reset();
        c->run(tp);
        const Comparison r = compare(c->got(), want, c->bounds());
        std::ostringstream where;
        where << std::setprecision(9) << op.name << " [" << s.label << "] isa " << isa_name(isa) << ", "
              << (tp ? tp->size() : 1) << " thread(s): " << r.n_bad << " of " << want.size()
              << " elements past the bound; worst: element " << r.worst << " got " << r.got << " want " << r.want
              << " bound " << r.bound << " (" << op.tolerance << ")";
        ASSERT_TRUE(r.ok) << where.str();
      }
    }
  }
}

// Every op is registered once, with test shapes, and every shape of the bench can be made.
TEST(KernelOpsRegistry, NamesAreUniqueAndEveryOpHasTestShapes) {
  std::set<std::string> names;
  for (const KernelOp& op : kernel_ops()) {
    EXPECT_TRUE(names.insert(op.name).second) << op.name;
    EXPECT_FALSE(op.test_shapes.empty()) << op.name;
    EXPECT_FALSE(op.tolerance.empty()) << op.name;
  }
}

std::string test_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string s;
  for (char ch : kernel_ops()[info.param].name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Registry, KernelOps, ::testing::Range(size_t{0}, kernel_ops().size()), test_name);

}  // namespace
}  // namespace afd::kernels::ops
