// Which rule orders the training instances (data.order): moecore's own, or OLMo-core's
// NumpyFSLDataLoader's, so that a run reads exactly the batches an OLMo-core run with the same seed
// reads from the same token files.
#pragma once

namespace moecore::data {

enum class OrderRule {
  // A SplitMix64 Fisher-Yates shuffle of every instance per epoch (0-based), epochs back to back.
  kMoecore,
  // NumPy's Generator(PCG64(seed + epoch)).shuffle with 1-based epochs, each cut to whole global
  // batches, and a global batch dealt to the data-parallel ranks round-robin (rank r takes every
  // dp-th instance from the r-th): OLMo-core's _build_global_indices and
  // _get_local_instance_indices.
  kOlmoCore,
};

}  // namespace moecore::data
