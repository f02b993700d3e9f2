// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state, one add and a mix per draw. Tiny, fully
// specified and identical on every platform, unlike std:: distributions, whose outputs are
// implementation-defined; data order and sampling must replay exactly after a resume.
#pragma once

#include <cstdint>

namespace moecore {

// The SplitMix64 output function on its own: derives well-mixed stream starts from nearby inputs.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }

  // Uniform integer in [0, bound), bound > 0, without modulo bias: the 2^64 mod bound lowest values
  // would make low residues more likely, so they are redrawn (under half the draws at worst).
  uint64_t bounded(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (true) {
      const uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

  // Uniform in [0, 1) with 53 random bits.
  double next_double() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace moecore
