// cudasim: CUB's DeviceRadixSort::SortPairs, the one CUB algorithm the kernels use: a stable sort
// of (key, value) pairs by the key's bits [begin_bit, end_bit), signed keys in their order (CUB
// flips the sign bit), issued on the stream like a launch. The first call with no scratch asks
// for its size, as CUB's does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace cudasim {
void issue_stream_work(cudaStream_t stream, std::function<void()> work);
bool inside_device_allocation(const void* pointer, size_t bytes);
void record_error(cudaError_t error, bool sticky, const std::string& message);
}  // namespace cudasim

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value>
  static cudaError_t SortPairs(void* scratch, size_t& scratch_bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out, int items,
                               int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                               cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<Key>, "cudasim sorts integer keys only");
    // CUB's scratch grows with the items (double buffers of keys and values); so does this one's,
    // which must be given whole, in device memory, and is filled with garbage before each sort.
    const size_t needed =
        256 + static_cast<size_t>(items > 0 ? items : 0) * 2 * (sizeof(Key) + sizeof(Value));
    if (scratch == nullptr) {
      scratch_bytes = needed;
      return cudaSuccess;
    }
    if (items < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(Key) * 8) ||
        begin_bit >= end_bit)
      return cudaErrorInvalidValue;
    const size_t n = static_cast<size_t>(items);
    const auto overlap = [](const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
      const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
      return x < y + b_bytes && y < x + a_bytes;
    };
    if (scratch_bytes < needed || !cudasim::inside_device_allocation(scratch, scratch_bytes) ||
        !cudasim::inside_device_allocation(keys_in, n * sizeof(Key)) ||
        !cudasim::inside_device_allocation(keys_out, n * sizeof(Key)) ||
        !cudasim::inside_device_allocation(values_in, n * sizeof(Value)) ||
        !cudasim::inside_device_allocation(values_out, n * sizeof(Value)) ||
        overlap(keys_in, n * sizeof(Key), keys_out, n * sizeof(Key)) ||
        overlap(values_in, n * sizeof(Value), values_out, n * sizeof(Value))) {
      cudasim::record_error(cudaErrorInvalidValue, false,
                            "cub::DeviceRadixSort::SortPairs: a scratch smaller than asked, an "
                            "operand outside device memory, or an input overlapping its output");
      return cudaErrorInvalidValue;
    }
    cudasim::issue_stream_work(stream, [=] {
      std::memset(scratch, 0xff, scratch_bytes);
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
