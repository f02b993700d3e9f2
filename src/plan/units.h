// The planner's units, shared by its models: the bytes of an fp32 (and int32) element, which
// weights, gradients, Adam moments, activations and exchanged rows are in moecore, and binary
// sizes.
#pragma once

namespace moecore::plan {

inline constexpr double kF = 4.0;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * kMiB;

}  // namespace moecore::plan
