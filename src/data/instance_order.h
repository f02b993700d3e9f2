// The order in which training instances are visited: a fresh shuffle of all instance indices in
// every epoch, determined only by (seed, epoch). The shuffle uses a generator and a bounded-integer
// routine spelled out here instead of std::shuffle / std::uniform_int_distribution, whose results
// are implementation-defined, so that a run resumed on another platform or standard library sees
// exactly the same instances.
//
// A cursor is the number of instances consumed since the start of training: epoch = cursor / E,
// offset = cursor % E, where an epoch visits E instances (all n under moecore's rule; under
// OLMo-core's the whole global batches they fill, data/order_rule.h). Saving the cursor in a
// checkpoint and constructing an InstanceOrder with the same arguments continues the identical
// sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "core/splitmix64.h"
#include "data/order_rule.h"

namespace moecore::data {

class InstanceOrder {
 public:
  // shuffle=false visits instances in file order every epoch (evaluation, debugging).
  InstanceOrder(uint64_t seed, int64_t num_instances, bool shuffle = true);
  // The shuffled order under `rule`. OLMo-core's: epoch e (0-based here) is NumPy's shuffle with
  // seed + e + 1, its first batch_instances * floor(n / batch_instances) instances (refused when
  // n < batch_instances); with chunks of `chunk_instances` consecutive instances (its
  // chunk_size, from max_target_sequence_length; n a multiple of it) the chunks are shuffled and
  // each read whole. moecore's ignores batch_instances and chunk_instances.
  static InstanceOrder with_rule(OrderRule rule, uint64_t seed, int64_t num_instances,
                                 int64_t batch_instances, int64_t chunk_instances = 1);

  // The instance index visited at global position `cursor`. Computes and caches the permutation
  // of cursor's epoch, so calls within one epoch are O(1); not thread-safe.
  int64_t instance_at(uint64_t cursor);

  // The instances `epoch` visits, in order (epoch_length() of them, none twice).
  std::vector<int64_t> permutation(uint64_t epoch) const;

  uint64_t epoch_of(uint64_t cursor) const { return cursor / static_cast<uint64_t>(epoch_length_); }
  int64_t epoch_length() const { return epoch_length_; }
  int64_t num_instances() const { return n_; }
  OrderRule rule() const { return rule_; }
  uint64_t seed() const { return seed_; }
  bool shuffled() const { return shuffle_; }

 private:
  uint64_t seed_;
  int64_t n_;
  bool shuffle_;
  OrderRule rule_ = OrderRule::kMoecore;
  int64_t chunk_ = 1;
  int64_t epoch_length_;
  uint64_t cached_epoch_ = 0;
  bool have_cache_ = false;
  std::vector<int64_t> cache_;
};

}  // namespace moecore::data
