// Tensor-by-tensor comparison of two dumps (io/tensor_dump.h) for `moecore diff`: normalised
// errors, the default threshold from the two precisions, and the first tensor where they part.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/tensor_dump.h"

namespace moecore::cli {

struct TensorDifference {
  std::string name, phase;
  std::vector<int64_t> shape;
  bool index = false;
  // Values: ||a - b||_2 / ||a||_2 over all elements, A the reference (0 when both are all zero,
  // infinite when only A is, or when a non-finite value differs). Index tensors (top-k expert ids):
  // the fraction of elements that differ.
  double normalised_error = 0.0;
  double max_abs_diff = 0.0;  // values only
  int64_t mismatches = 0;     // elements that differ at all
  bool parted = false;        // beyond the threshold (values) or any id differing (index)
};

// The tensors of A in A's order, each against B's of the same name. Names present on one side
// only, or shapes that differ, are a one-line error naming the tensor: the dumps are of different
// models.
std::vector<TensorDifference> compare_dumps(const io::TensorDump& a, const io::TensorDump& b,
                                            double threshold);

// Unit roundoff of a compute precision named in a manifest ("fp32", "bf16", ...); nullopt when
// unknown.
std::optional<double> unit_roundoff(const std::string& precision);

// The default threshold: max(4 u, 2^-18) with u the unit roundoff of the more precise of the two
// (what both runs hold until one rounds coarser; 2^-18 = sqrt(4096) x 2^-24 allows fp32 sums of a
// few thousand terms added in another order, as another build does). `rule` receives a one-line
// statement of it. An unknown precision is an error asking for --threshold.
double default_threshold(const std::string& precision_a, const std::string& precision_b,
                         std::string& rule);

}  // namespace moecore::cli
