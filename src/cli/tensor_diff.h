// Tensor-by-tensor comparison of two dumps (io/tensor_dump.h) for `moecore diff`: normalised
// errors, the default threshold from the two precisions, and the first tensor where they part.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
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
// unknown. mxfp8 is bf16's: the finest rounding its recipe makes (of its non-MX GEMMs' operands;
// E4M3's 2^-4 rounds only what its MX GEMMs read).
std::optional<double> unit_roundoff(const std::string& precision);

// A side's compute precision as its manifest records it: train.precision and, for mxfp8, its
// variant (manifest "mxfp8": scale mode, dense, expert_wgrad; null in dumps that predate it).
struct RunPrecision {
  std::string precision;
  nlohmann::json mxfp8;
};

RunPrecision run_precision(const io::TensorDump& dump);

// "mxfp8 (rceil scales, mxfp8_dense false, mxfp8_expert_wgrad false)", or the precision's name.
std::string describe_precision(const RunPrecision& precision);

// The default threshold: max(4 u, 2^-18) with u the unit roundoff of the more precise of the two
// (what both runs hold until one rounds coarser; 2^-18 = sqrt(4096) x 2^-24 allows fp32 sums of a
// few thousand terms added in another order, as another build does). Two mxfp8 runs share bf16's
// u: in one recipe that is all they can part by (see tensor_diff.cpp), and in two variants it
// holds them until the first GEMM their recipes run differently. `rule` receives a one-line
// statement of it. An unknown precision is an error asking for --threshold.
double default_threshold(const RunPrecision& a, const RunPrecision& b, std::string& rule);

}  // namespace moecore::cli
