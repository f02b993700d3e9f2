// Hash-map keys shared by the BPE trainer and the tokenizer: a pair of token ids packed into 64
// bits, and string keys that can be looked up by std::string_view without a copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/splitmix64.h"

namespace moecore::data {

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
inline int32_t pair_left(uint64_t key) {
  return static_cast<int32_t>(key >> 32);
}
inline int32_t pair_right(uint64_t key) {
  return static_cast<int32_t>(key & 0xFFFFFFFFULL);
}

// Packed pairs differ in few bits; the SplitMix64 finaliser spreads them over the buckets.
struct PairHash {
  size_t operator()(uint64_t key) const { return static_cast<size_t>(mix64(key)); }
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

}  // namespace moecore::data
