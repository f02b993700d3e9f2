#include "cli/tensor_diff.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/check.h"

namespace moecore::cli {

namespace {

// Whether a[i] and b[i] count as equal although non-finite: the same infinity, or both NaN.
bool same_non_finite(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || (std::isinf(a) && a == b);
}

TensorDifference compare(const io::DumpedTensor& a, const io::DumpedTensor& b, double threshold) {
  TensorDifference diff{a.name, a.phase, a.shape, a.index};
  double diff_sq = 0.0, ref_sq = 0.0;
  bool non_finite_differs = false;
  for (size_t i = 0; i < a.values.size(); ++i) {
    const float x = a.values[i], y = b.values[i];
    if (!std::isfinite(x) || !std::isfinite(y)) {
      const bool same = same_non_finite(x, y);
      non_finite_differs = non_finite_differs || !same;
      diff.mismatches += same ? 0 : 1;
      continue;
    }
    const double delta = static_cast<double>(x) - static_cast<double>(y);
    diff.mismatches += delta != 0.0 ? 1 : 0;
    diff_sq += delta * delta;
    ref_sq += static_cast<double>(x) * static_cast<double>(x);
    diff.max_abs_diff = std::max(diff.max_abs_diff, std::abs(delta));
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (a.index) {
    diff.normalised_error = a.values.empty() ? 0.0
                                             : static_cast<double>(diff.mismatches) /
                                                   static_cast<double>(a.values.size());
    diff.max_abs_diff = 0.0;
    diff.parted = diff.mismatches > 0;
    return diff;
  }
  if (non_finite_differs) {
    diff.normalised_error = kInf;
    diff.max_abs_diff = kInf;
  } else if (diff_sq == 0.0) {
    diff.normalised_error = 0.0;
  } else {
    diff.normalised_error = ref_sq > 0.0 ? std::sqrt(diff_sq / ref_sq) : kInf;
  }
  diff.parted = diff.normalised_error > threshold;
  return diff;
}

}  // namespace

std::vector<TensorDifference> compare_dumps(const io::TensorDump& a, const io::TensorDump& b,
                                            double threshold) {
  std::map<std::string, const io::DumpedTensor*> in_b;
  for (const io::DumpedTensor& t : b.tensors) in_b[t.name] = &t;
  std::vector<TensorDifference> out;
  for (const io::DumpedTensor& t : a.tensors) {
    const auto found = in_b.find(t.name);
    MOE_CHECK(found != in_b.end(),
              "[diff] tensor {} is in A but not in B (dumps of different models or builds)",
              t.name);
    const io::DumpedTensor& other = *found->second;
    MOE_CHECK(other.shape == t.shape, "[diff] tensor {} is {} in A but {} in B (different models)",
              t.name, t.shape, other.shape);
    MOE_CHECK(other.index == t.index,
              "[diff] tensor {} holds ids in one dump and values in the other", t.name);
    out.push_back(compare(t, other, threshold));
    in_b.erase(found);
  }
  MOE_CHECK(in_b.empty(), "[diff] tensor {} is in B but not in A (dumps of different models)",
            in_b.empty() ? "" : in_b.begin()->first);
  return out;
}

std::optional<double> unit_roundoff(const std::string& precision) {
  // 2^-p for p significand bits (the implicit one included): rounding to nearest errs by at most
  // half a unit in the last place, 2^-p relative.
  if (precision == "fp32") return std::ldexp(1.0, -24);
  if (precision == "tf32" || precision == "fp16") return std::ldexp(1.0, -11);
  if (precision == "bf16") return std::ldexp(1.0, -8);
  if (precision == "mxfp8") return std::ldexp(1.0, -4);  // E4M3 elements
  return std::nullopt;
}

double default_threshold(const std::string& precision_a, const std::string& precision_b,
                         std::string& rule) {
  const std::optional<double> ua = unit_roundoff(precision_a), ub = unit_roundoff(precision_b);
  MOE_CHECK(
      ua && ub,
      "[diff] no default threshold for precision '{}' (known: fp32, tf32, fp16, bf16, mxfp8); "
      "pass --threshold",
      ua ? precision_b : precision_a);
  const std::string& finer = *ua <= *ub ? precision_a : precision_b;
  const double u = std::min(*ua, *ub);
  const double floor = std::ldexp(1.0, -18);
  const double threshold = std::max(4.0 * u, floor);
  rule = fmt::format(
      "max(4 x unit roundoff of {} ({:.3g}), 2^-18 for fp32 sums in another order) = {:.3g}", finer,
      u, threshold);
  return threshold;
}

}  // namespace moecore::cli
