#include "data/instance_order.h"

#include <numeric>
#include <utility>

#include "core/check.h"

namespace moecore::data {

namespace {

// The SplitMix64 output function, used on its own to derive a well-mixed stream start from
// (seed, epoch): nearby seeds or epochs then give unrelated shuffles.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t SplitMix64::next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return mix64(state_);
}

uint64_t SplitMix64::bounded(uint64_t bound) {
  // 2^64 mod bound, computed in 64-bit arithmetic; values below it would make the low residues
  // more likely, so they are redrawn (fewer than half the draws even in the worst case).
  const uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

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
