// Initial parameter values drawn from normal distributions, one stream per tensor: each target is
// filled by its own std::mt19937_64 (seeded by the caller) through std::normal_distribution<float>,
// so its values depend only on its seed, never on which thread draws it or what is drawn beside
// it. Host memory only (parameters that live on a device are drawn on the host and copied,
// model/params.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace moecore::kernels {

struct NormalFill {
  float* values;
  size_t count;
  uint64_t seed;  // of this target's std::mt19937_64
  float stddev;   // of the zero-mean normal
  // Truncated at +-3 stddev, as torch's trunc_normal_(a=-3 std, b=3 std): a draw outside is drawn
  // again (the same distribution as torch's inverse-CDF sampling). Off: every draw kept.
  bool truncated = false;
};

// Fills every target, several at once on the OpenMP threads: a GPU-sized model holds billions of
// values, which one thread draws in over a minute (about 22 ns a value).
void fill_normal(std::span<const NormalFill> fills);

}  // namespace moecore::kernels
