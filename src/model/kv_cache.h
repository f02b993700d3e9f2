// Key/value cache for autoregressive decoding, batch 1 (one sequence; serve several sequences with
// several caches). Per layer it holds K and V rows [max_seq, nkv*hd]; K rows are stored after
// QK-norm and RoPE, so a cached key never needs rotating again. All layers share one length: a
// position becomes visible to every layer once the step that wrote it calls advance(). The rows
// live on the default device (core/device_memory.h) at construction, with the model's weights.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device_memory.h"

namespace moecore {

class KvCache {
 public:
  KvCache() = default;
  // Throws moecore::Error when a size is not positive.
  KvCache(int64_t num_layers, int64_t max_seq, int64_t kv_size);

  int64_t num_layers() const { return num_layers_; }
  int64_t max_seq() const { return max_seq_; }
  int64_t kv_size() const { return kv_size_; }  // nkv * hd floats per row
  int64_t length() const { return length_; }    // positions filled so far
  int64_t remaining() const { return max_seq_ - length_; }

  // Row `pos` of a layer's keys / values: [kv_size]. Rows [0, length) are valid; a step writes rows
  // [length, length + n) and then calls advance(n). Unchecked in release code paths, as a kernel.
  float* k(int64_t layer, int64_t pos) { return keys_.data() + offset(layer, pos); }
  float* v(int64_t layer, int64_t pos) { return values_.data() + offset(layer, pos); }
  const float* k(int64_t layer, int64_t pos) const { return keys_.data() + offset(layer, pos); }
  const float* v(int64_t layer, int64_t pos) const { return values_.data() + offset(layer, pos); }

  // Throws moecore::Error when length + n would exceed max_seq.
  void check_room(int64_t n) const;
  void advance(int64_t n);       // length += n (checked)
  void reset() { length_ = 0; }  // forget the sequence; the memory stays allocated

 private:
  size_t offset(int64_t layer, int64_t pos) const {
    return static_cast<size_t>((layer * max_seq_ + pos) * kv_size_);
  }

  int64_t num_layers_ = 0, max_seq_ = 0, kv_size_ = 0, length_ = 0;
  DeviceArray<float> keys_;    // [L, max_seq, kv_size]
  DeviceArray<float> values_;  // [L, max_seq, kv_size]
};

}  // namespace moecore
