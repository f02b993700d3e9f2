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
  MOE_CHECK(in_b.empty(),
            "[diff] tensor {} is in B but not in A (dumps of different models or builds)",
            in_b.empty() ? "" : in_b.begin()->first);
  return out;
}

std::optional<double> unit_roundoff(const std::string& precision) {
  // 2^-p for p significand bits (the implicit one included): rounding to nearest errs by at most
  // half a unit in the last place, 2^-p relative.
  if (precision == "fp32") return std::ldexp(1.0, -24);
  if (precision == "tf32" || precision == "fp16") return std::ldexp(1.0, -11);
  if (precision == "bf16" || precision == "mxfp8") return std::ldexp(1.0, -8);
  return std::nullopt;
}

RunPrecision run_precision(const io::TensorDump& dump) {
  const auto precision = dump.run.find("precision");
  const auto mxfp8 = dump.run.find("mxfp8");
  return {
      precision != dump.run.end() && precision->is_string() ? precision->get<std::string>() : "",
      mxfp8 != dump.run.end() ? *mxfp8 : nlohmann::json()};
}

std::string describe_precision(const RunPrecision& p) {
  if (p.precision != "mxfp8" || !p.mxfp8.is_object()) return p.precision;
  return fmt::format("mxfp8 ({} scales, mxfp8_dense {}, mxfp8_expert_wgrad {})",
                     p.mxfp8.value("scale", "?"), p.mxfp8.value("dense", false),
                     p.mxfp8.value("expert_wgrad", false));
}

// Two mxfp8 runs, and why bf16's 4 u holds them. In one recipe (CPU against GPU, two builds) their
// MX GEMMs multiply the same codes: E4M3 x E4M3 products and power-of-two scales are exact in
// fp32, so those GEMMs part by the sums' order alone, as fp32 does, and the runs part by what
// their bf16 parts (attention core, LM head, the experts' bf16 weight gradients) part by, the bf16
// rule. An E4M3 code flips only where the two sides' inputs straddle a rounding boundary: for
// inputs that part by a normalised e, a fraction of about e / 2^-3 of the elements, each then off
// by one E4M3 step (2^-3 relative), which adds about sqrt(e / 2^-3) x 2^-3 = sqrt(e x 2^-3) to the
// normalised error. That stays under 4 x 2^-8 = 2^-6 while e < 2^-9 (2.0e-3); CPU and GPU part by
// at most 6.2e-4 before any MX GEMM (measured: tests/train/test_cuda_sim_program.py), so the flips
// add at most about sqrt(6.2e-4 x 2^-3) = 8.8e-3. Two variants (scale mode, mxfp8_dense,
// mxfp8_expert_wgrad) are the same recipe up to the first GEMM one of them runs differently, which
// then parts by MX roundings of its operands (measured 2.8e-2 to 4.5e-2 for floor against rceil
// scales, 3.7e-2 for mxfp8_dense's first projection): 2^-6 finds that GEMM, where E4M3's
// 4 u = 2^-2 let every MX difference through.
double default_threshold(const RunPrecision& a, const RunPrecision& b, std::string& rule) {
  const std::optional<double> ua = unit_roundoff(a.precision), ub = unit_roundoff(b.precision);
  MOE_CHECK(
      ua && ub,
      "[diff] no default threshold for precision '{}' (known: fp32, tf32, fp16, bf16, mxfp8); "
      "pass --threshold",
      ua ? b.precision : a.precision);
  const std::string& finer = *ua <= *ub ? a.precision : b.precision;
  const double u = std::min(*ua, *ub);
  const double floor = std::ldexp(1.0, -18);
  const double threshold = std::max(4.0 * u, floor);
  if (a.precision == "mxfp8" && b.precision == "mxfp8") {
    // Dumps written before the variant was recorded say nothing about it.
    const bool recorded = a.mxfp8.is_object() && b.mxfp8.is_object();
    const bool same_variant = recorded && a.mxfp8 == b.mxfp8;
    rule = fmt::format("4 x unit roundoff of bf16 ({:.3g}) = {:.3g}: {}", u, threshold,
                       !recorded ? std::string("mxfp8 on both sides (a dump does not record its "
                                               "variant): the same rule for one recipe or two")
                       : same_variant
                           ? "one mxfp8 recipe on both sides, whose MX GEMMs are exact on the same "
                             "codes: they part by what its bf16 parts part by"
                           : fmt::format("two mxfp8 variants ({} vs {}), the same recipe until the "
                                         "first GEMM they run differently",
                                         describe_precision(a), describe_precision(b)));
    return threshold;
  }
  rule = fmt::format(
      "max(4 x unit roundoff of {} ({:.3g}), 2^-18 for fp32 sums in another order) = {:.3g}", finer,
      u, threshold);
  return threshold;
}

}  // namespace moecore::cli
