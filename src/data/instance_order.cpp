#include "data/instance_order.h"

#include <numeric>
#include <utility>

#include "core/check.h"
#include "data/numpy_shuffle.h"

namespace moecore::data {

InstanceOrder::InstanceOrder(uint64_t seed, int64_t num_instances, bool shuffle)
    : seed_(seed), n_(num_instances), shuffle_(shuffle), epoch_length_(num_instances) {
  MOE_CHECK(num_instances > 0, "[data] instance order needs at least one instance, got {}",
            num_instances);
}

InstanceOrder InstanceOrder::with_rule(OrderRule rule, uint64_t seed, int64_t num_instances,
                                       int64_t batch_instances, int64_t chunk_instances) {
  if (rule == OrderRule::kMoecore) return InstanceOrder(seed, num_instances);
  MOE_CHECK(batch_instances > 0, "[data] a global batch needs at least one instance, got {}",
            batch_instances);
  // OLMo-core's seed + epoch is a Python integer; here it must not wrap (a TOML seed is below
  // 2^63, which leaves 2^63 epochs).
  MOE_CHECK(seed < (uint64_t{1} << 63),
            "[data] data.order = \"olmo-core\" takes a train.seed below 2^63, got {}", seed);
  // OLMo-core keeps its indices as uint32 and asserts the count stays below the largest.
  MOE_CHECK(
      num_instances < 0xffffffffLL,
      "[data] data.order = \"olmo-core\" orders fewer than 2^32 - 1 instances (as OLMo-core's "
      "uint32 indices), the training set has {}",
      num_instances);
  MOE_CHECK(num_instances >= batch_instances,
            "[data] data.order = \"olmo-core\" visits whole global batches, and the training set's "
            "{} instances do not fill one of train.batch_size = {}",
            num_instances, batch_instances);
  MOE_CHECK(chunk_instances >= 1 && num_instances % chunk_instances == 0,
            "[data] {} instances are not whole chunks of {}", num_instances, chunk_instances);
  InstanceOrder order(seed, num_instances);
  order.rule_ = OrderRule::kOlmoCore;
  order.chunk_ = chunk_instances;
  order.epoch_length_ = batch_instances * (num_instances / batch_instances);
  return order;
}

std::vector<int64_t> InstanceOrder::permutation(uint64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle_) return order;
  if (rule_ == OrderRule::kOlmoCore) {
    // OLMo-core's epochs count from 1; with chunks, the chunks' indices are shuffled and each
    // chunk read in order (its _build_global_indices). The chunk indices are shuffled in the
    // front of `order` and expanded from the back, in place: chunk c's instances go at c x chunk
    // and after, never over the chunk indices still to be read (those below c).
    const auto chunks = static_cast<size_t>(n_ / chunk_), chunk = static_cast<size_t>(chunk_);
    order.resize(chunks);
    numpy_shuffle(seed_ + epoch + 1, order);
    if (chunk > 1) {
      order.resize(static_cast<size_t>(n_));
      for (size_t c = chunks; c-- > 0;) {
        const int64_t first = order[c] * chunk_;
        for (size_t i = chunk; i-- > 0;) order[c * chunk + i] = first + static_cast<int64_t>(i);
      }
    }
    order.resize(static_cast<size_t>(epoch_length_));
    return order;
  }
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
  return cache_[static_cast<size_t>(cursor % static_cast<uint64_t>(epoch_length_))];
}

}  // namespace moecore::data
