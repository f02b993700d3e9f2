// The first NaN or infinity of a float range: what a save refuses to write and a load refuses to
// compute with (checkpoint writers, resume verification, imported weights, the self-check).
#pragma once

#include <algorithm>
#include <cmath>

namespace moecore {

// `end` when every value is finite.
inline const float* first_non_finite(const float* begin, const float* end) {
  return std::find_if_not(begin, end, [](float v) { return std::isfinite(v); });
}

}  // namespace moecore
