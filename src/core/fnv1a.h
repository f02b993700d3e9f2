// FNV-1a, 64 bits: a stable, dependency-free identity of bytes (a dataset's sampled tokens, a
// dump's inputs, a GPU's UUID), the same on every host and build. Not for adversarial input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace moecore {

inline constexpr uint64_t kFnv1aOffsetBasis = 0xcbf29ce484222325ULL;

// `hash`: the value to continue from (the offset basis to start), so that pieces chain.
inline uint64_t fnv1a(std::span<const std::byte> bytes, uint64_t hash = kFnv1aOffsetBasis) {
  for (const std::byte b : bytes) hash = (hash ^ static_cast<uint64_t>(b)) * 0x100000001b3ULL;
  return hash;
}

}  // namespace moecore
