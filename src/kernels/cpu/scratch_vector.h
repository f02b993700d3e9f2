// Per-thread scratch in a std::vector that only grows: grown to the largest call, it asks the heap
// for nothing after a training step's first calls (issue 14). std::vector::resize value-initialises
// every element it adds, also within its capacity, so scratch resized to each call's size would
// be zero-filled again whenever a call needs more than the one before (the experts' row counts
// change from call to call): perf put 0.6 % of a bf16 step in that memset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moecore::kernels::cpu {

// v's storage with room for at least `count` elements, whose values the caller writes before it
// reads them.
template <typename T>
T* scratch_of_at_least(std::vector<T>& v, int64_t count) {
  const auto n = static_cast<size_t>(count);
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace moecore::kernels::cpu
