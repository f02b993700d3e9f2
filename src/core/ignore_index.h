// The target id that marks a position without a label (PyTorch's cross_entropy ignore_index): the
// data pipeline writes it, the losses skip it.
#pragma once

#include <cstdint>

namespace moecore {

inline constexpr int32_t kIgnoreIndex = -100;

}  // namespace moecore
