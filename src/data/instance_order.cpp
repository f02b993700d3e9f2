#include "data/instance_order.h"

#include <numeric>
#include <utility>

#include "core/check.h"

namespace moecore::data {

InstanceOrder::InstanceOrder(uint64_t seed, int64_t num_instances, bool shuffle)
    : seed_(seed), n_(num_instances), shuffle_(shuffle) {
  MOE_CHECK(num_instances > 0, "[data] instance order needs at least one instance, got {}",
            num_instances);
}

std::vector<int64_t> InstanceOrder::permutation(uint64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle_) return order;
  SplitMix64 rng(mix64(seed_ ^ mix64(epoch + 0x632be59bd9b4e019ULL)));
  // Fisher-Yates, from the back: position i takes a uniform pick among the first i+1.
  for (size_t i = order.size() - 1; i > 0; --i) {
    const auto j = static_cast<size_t>(rng.bounded(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

int64_t InstanceOrder::instance_at(uint64_t cursor) {
  const uint64_t epoch = epoch_of(cursor);
  if (!have_cache_ || cached_epoch_ != epoch) {
    cache_ = permutation(epoch);
    cached_epoch_ = epoch;
    have_cache_ = true;
  }
  return cache_[static_cast<size_t>(cursor % static_cast<uint64_t>(n_))];
}

}  // namespace moecore::data
