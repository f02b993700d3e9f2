#include "data/numpy_shuffle.h"

#include <utility>

namespace moecore::data {

namespace {

// SeedSequence's hash constants (bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu, kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu, kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;
constexpr size_t kPoolWords = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// PCG64's multiplier, 0x2360ed051fc65da44385df649fccf645 (pcg64.h PCG_DEFAULT_MULTIPLIER_128).
constexpr Uint128 kPcgMultiplier =
    (static_cast<Uint128>(0x2360ed051fc65da4ULL) << 64) | 0x4385df649fccf645ULL;

Uint128 u128(uint64_t high, uint64_t low) {
  return (static_cast<Uint128>(high) << 64) | low;
}

}  // namespace

std::array<uint64_t, 4> numpy_seed_sequence_state(uint64_t entropy) {
  // The integer as 32-bit words, least significant first; 0 is one word (_coerce_to_uint32_array).
  std::vector<uint32_t> words;
  do {
    words.push_back(static_cast<uint32_t>(entropy));
    entropy >>= 32;
  } while (entropy != 0);

  std::array<uint32_t, kPoolWords> pool{};
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolWords; ++i)
    pool[i] = hashmix(i < words.size() ? words[i] : 0u, hash_const);
  for (size_t src = 0; src < kPoolWords; ++src)
    for (size_t dst = 0; dst < kPoolWords; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  // Two words never exceed the pool: no words are left to mix in.

  // generate_state(4, uint64): eight 32-bit words cycling over the pool, paired little-endian.
  std::array<uint64_t, 4> state{};
  uint32_t out_const = kInitB;
  for (size_t i = 0; i < 2 * state.size(); ++i) {
    uint32_t value = pool[i % kPoolWords];
    value ^= out_const;
    out_const *= kMultB;
    value *= out_const;
    value ^= value >> kXShift;
    state[i / 2] |= static_cast<uint64_t>(value) << (32 * (i % 2));
  }
  return state;
}

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  const std::array<uint64_t, 4> words = numpy_seed_sequence_state(seed);
  // pcg64_set_seed: state words (high, low), stream words (high, low); pcg_setseq_128_srandom_r.
  increment_ = (u128(words[2], words[3]) << 1) | 1u;
  state_ = 0;
  step();
  state_ += u128(words[0], words[1]);
  step();
}

void NumpyPcg64::step() {
  state_ = state_ * kPcgMultiplier + increment_;
}

uint64_t NumpyPcg64::next_uint64() {
  step();
  // XSL-RR: the halves xor-ed, rotated right by the top six bits.
  const auto high = static_cast<uint64_t>(state_ >> 64);
  const uint64_t folded = high ^ static_cast<uint64_t>(state_);
  const unsigned rotation = static_cast<unsigned>(high >> 58);
  return (folded >> rotation) | (folded << ((64u - rotation) & 63u));
}

uint32_t NumpyPcg64::next_uint32() {
  if (has_half_) {
    has_half_ = false;
    return half_;
  }
  const uint64_t draw = next_uint64();
  has_half_ = true;
  half_ = static_cast<uint32_t>(draw >> 32);
  return static_cast<uint32_t>(draw);
}

uint64_t NumpyPcg64::interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;  // the smallest all-ones mask covering max
  for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
  uint64_t value = 0;
  if (max <= 0xffffffffULL) {
    do value = next_uint32() & mask;
    while (value > max);
  } else {
    do value = next_uint64() & mask;
    while (value > max);
  }
  return value;
}

void numpy_shuffle(uint64_t seed, std::vector<int64_t>& values) {
  NumpyPcg64 rng(seed);
  for (size_t i = values.size(); i-- > 1;) std::swap(values[i], values[rng.interval(i)]);
}

}  // namespace moecore::data
