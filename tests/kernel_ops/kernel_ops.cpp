#include "kernel_ops.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace afd::kernels::ops {

Shape shape(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  Shape s;
  for (const auto& [name, v] : dims) {
    if (!s.label.empty()) s.label += ' ';
    s.label += std::string(name) + "=" + std::to_string(v);
    s.d.push_back(v);
  }
  return s;
}

const std::vector<KernelOp>& kernel_ops() {
  static const std::vector<KernelOp> ops = [] {
    std::vector<KernelOp> v;
    add_linear_ops(v);
    add_elementwise_ops(v);
    add_attention_ops(v);
    return v;
  }();
  return ops;
}

Comparison compare(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& bounds) {
  Comparison c;
  if (got.size() != want.size() || bounds.size() != want.size()) {
    c.ok = false;
    c.n_bad = -1;
    return c;
  }
  double worst_excess = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    // Bit-identical where the bound is 0; else within it (equal infinities and two NaNs pass).
    const bool ok = bounds[i] == 0
                        ? f32_bits(got[i]) == f32_bits(want[i])
                        : got[i] == want[i] || diff <= bounds[i] || (std::isnan(got[i]) && std::isnan(want[i]));
    if (!ok) {
      c.ok = false;
      ++c.n_bad;
    }
    // The worst element: any failure before any pass, then the largest excess over the bound.
    const double excess = std::isnan(diff) ? 1e300 : diff - bounds[i];
    const double key = ok ? excess : 1e30 + excess;
    if (key > worst_excess || c.worst < 0) {
      worst_excess = key;
      c.worst = static_cast<int64_t>(i);
      c.got = got[i];
      c.want = want[i];
      c.bound = bounds[i];
    }
  }
  return c;
}

}  // namespace afd::kernels::ops
