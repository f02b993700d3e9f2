// NumPy's `np.random.Generator(np.random.PCG64(seed)).shuffle(array)` for a 1-D array, bit for
// bit: the permutation OLMo-core's data loader visits its instances in (`get_rng(seed + epoch)`
// then `rng.shuffle(indices)`, olmo_core/data/data_loader.py). Three parts, each NumPy's own:
//  - SeedSequence(seed).generate_state(4, uint64): the integer seed cut into 32-bit words, hashed
//    into a 4-word pool and drawn out again (numpy/random/bit_generator.pyx);
//  - PCG64 (O'Neill's 128-bit LCG with the XSL-RR output; numpy/random/src/pcg64), seeded with the
//    first two state words as its state and the last two as its stream, 32-bit draws taken as the
//    low then the high half of one 64-bit output;
//  - Fisher-Yates from the back with `random_interval` (a masked draw redrawn while above the
//    bound: 32-bit draws for a bound that fits them), numpy/random/_generator.pyx `_shuffle_raw`.
// tests/reference/test_olmo_core_data_order.py holds it against NumPy and OLMo-core's loader.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace moecore::data {

// SeedSequence(entropy).generate_state(4, np.uint64) for a non-negative integer entropy.
std::array<uint64_t, 4> numpy_seed_sequence_state(uint64_t entropy);

// GCC's and Clang's 128-bit integer (__extension__: not ISO C++, so -Wpedantic is told it is
// meant).
__extension__ typedef unsigned __int128 Uint128;

class NumpyPcg64 {
 public:
  // np.random.PCG64(seed): seeded through numpy_seed_sequence_state.
  explicit NumpyPcg64(uint64_t seed);

  uint64_t next_uint64();
  // Half of a 64-bit draw at a time, the low half first (NumPy keeps the high half for the next).
  uint32_t next_uint32();
  // A uniform integer in [0, max] (random_interval).
  uint64_t interval(uint64_t max);

 private:
  void step();
  Uint128 state_ = 0;
  Uint128 increment_ = 0;
  bool has_half_ = false;
  uint32_t half_ = 0;
};

// Shuffles `values` in place as Generator(PCG64(seed)).shuffle does.
void numpy_shuffle(uint64_t seed, std::vector<int64_t>& values);

}  // namespace moecore::data
