// The CUDA backend's check of row numbers and token ids held in device memory: the CPU backend
// rejects an index outside its tensor, and so does this one, by finding the first such index on
// the device and reading it back (so the calling operation waits for the stream).
#pragma once

#include <cstdint>
#include <optional>

namespace moecore::kernels::cuda {

struct BadIndex {
  int64_t position;  // where in the index array
  int32_t value;
};

// The first of indices[0, count) (device memory) outside [0, limit), or none.
std::optional<BadIndex> first_index_outside(const int32_t* indices, int64_t count, int64_t limit);

}  // namespace moecore::kernels::cuda
