// cudasim: CUB's DeviceRadixSort::SortPairs, the one CUB algorithm the kernels use: a stable sort
// of (key, value) pairs by the key's bits [begin_bit, end_bit), signed keys in their order (CUB
// flips the sign bit), issued on the stream like a launch. The first call with no scratch asks
// for its size, as CUB's does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cudasim {
void issue_stream_work(cudaStream_t stream, std::function<void()> work);
}

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value>
  static cudaError_t SortPairs(void* scratch, size_t& scratch_bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out, int items,
                               int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                               cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<Key>, "cudasim sorts integer keys only");
    if (scratch == nullptr) {
      scratch_bytes = 256;
      return cudaSuccess;
    }
    if (items < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(Key) * 8) ||
        begin_bit >= end_bit)
      return cudaErrorInvalidValue;
    cudasim::issue_stream_work(stream, [=] {
      using Bits = std::make_unsigned_t<Key>;
      const int width = end_bit - begin_bit;
      const Bits sign = std::is_signed_v<Key> ? Bits{1} << (sizeof(Key) * 8 - 1) : Bits{0};
      const auto radix = [&](Key key) {
        const Bits twiddled = static_cast<Bits>(static_cast<Bits>(key) ^ sign);
        const Bits shifted = static_cast<Bits>(twiddled >> begin_bit);
        return width >= static_cast<int>(sizeof(Key) * 8)
                   ? shifted
                   : static_cast<Bits>(shifted & ((Bits{1} << width) - 1));
      };
      std::vector<int> order(static_cast<size_t>(items));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return radix(keys_in[a]) < radix(keys_in[b]); });
      std::vector<Key> keys(static_cast<size_t>(items));
      std::vector<Value> values(static_cast<size_t>(items));
      for (int i = 0; i < items; ++i) {
        keys[static_cast<size_t>(i)] = keys_in[order[static_cast<size_t>(i)]];
        values[static_cast<size_t>(i)] = values_in[order[static_cast<size_t>(i)]];
      }
      std::copy(keys.begin(), keys.end(), keys_out);
      std::copy(values.begin(), values.end(), values_out);
    });
    return cudaSuccess;
  }
};

}  // namespace cub
