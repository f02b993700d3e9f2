// Shapes, counts and offsets are int64_t throughout moecore (signed, as in PyTorch); std::vector
// sizes and subscripts are size_t. to_size converts one that is known to be non-negative, so
// that the conversion -Wsign-conversion asks for is one short, named call.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moecore {

constexpr size_t to_size(int64_t i) {
  return static_cast<size_t>(i);
}

}  // namespace moecore
