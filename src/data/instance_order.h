// The order in which training instances are visited: a fresh shuffle of all instance indices in
// every epoch, determined only by (seed, epoch). The shuffle uses a generator and a bounded-integer
// routine spelled out here instead of std::shuffle / std::uniform_int_distribution, whose results
// are implementation-defined, so that a run resumed on another platform or standard library sees
// exactly the same instances.
//
// A cursor is the number of instances consumed since the start of training: epoch = cursor / n,
// offset = cursor % n. Saving the cursor in a checkpoint and constructing an InstanceOrder with the
// same (seed, num_instances) continues the identical sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "core/splitmix64.h"

namespace moecore::data {

class InstanceOrder {
 public:
  // shuffle=false visits instances in file order every epoch (evaluation, debugging).
  InstanceOrder(uint64_t seed, int64_t num_instances, bool shuffle = true);

  // The instance index visited at global position `cursor`. Computes and caches the permutation
  // of cursor's epoch, so calls within one epoch are O(1); not thread-safe.
  int64_t instance_at(uint64_t cursor);

  // The full visiting order of `epoch` (a permutation of 0..num_instances-1).
  std::vector<int64_t> permutation(uint64_t epoch) const;

  uint64_t epoch_of(uint64_t cursor) const { return cursor / static_cast<uint64_t>(n_); }
  int64_t num_instances() const { return n_; }
  uint64_t seed() const { return seed_; }
  bool shuffled() const { return shuffle_; }

 private:
  uint64_t seed_;
  int64_t n_;
  bool shuffle_;
  uint64_t cached_epoch_ = 0;
  bool have_cache_ = false;
  std::vector<int64_t> cache_;
};

}  // namespace moecore::data
