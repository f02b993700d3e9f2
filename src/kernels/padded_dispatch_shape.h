// The static sizes of padded_dispatch_plan (kernels/ops.h), in a header of its own because the
// CUDA kernels read it too (nvcc does not compile ops.h).
#pragma once

#include <cstdint>

namespace moecore {

// An ep group of `ranks` ranks, each holding `local_experts` consecutive experts (E = ranks x
// local_experts), as rank `rank` plans it: each destination keeps at most `capacity` rows (the
// rowwise capacity, dist/rowwise_plan.h), and each (source, destination) pair has `block_rows`
// rows of the padded all-to-all (at least as many as a pair can keep).
struct PaddedDispatchShape {
  int64_t rank = 0, ranks = 1, local_experts = 1;
  int64_t capacity = 0, block_rows = 0;
};

}  // namespace moecore
