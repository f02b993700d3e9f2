#include "model/kv_cache.h"

#include "core/check.h"

namespace moecore {

KvCache::KvCache(int64_t num_layers, int64_t max_seq, int64_t kv_size)
    : num_layers_(num_layers), max_seq_(max_seq), kv_size_(kv_size) {
  MOE_CHECK(num_layers > 0 && max_seq > 0 && kv_size > 0,
            "[kv_cache] num_layers={} max_seq={} kv_size={} must all be positive", num_layers,
            max_seq, kv_size);
  const size_t n = static_cast<size_t>(num_layers * max_seq * kv_size);
  keys_.resize(n);  // zeroed
  values_.resize(n);
}

void KvCache::check_room(int64_t n) const {
  MOE_CHECK(n >= 0 && length_ + n <= max_seq_,
            "[kv_cache] appending {} token(s) at length {} would exceed max_seq={}", n, length_,
            max_seq_);
}

void KvCache::advance(int64_t n) {
  check_room(n);
  length_ += n;
}

}  // namespace moecore
