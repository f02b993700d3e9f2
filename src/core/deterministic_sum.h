// A parallel sum whose result does not depend on the thread count or on scheduling: the range is
// cut into fixed chunks, each chunk is summed in double in index order, and the chunk sums are
// added in chunk order. OpenMP's reduction clause combines partial sums in arrival order, which
// would make losses, gradient norms (and so clipped updates) differ bit-wise between identical
// runs; resumed runs must reproduce uninterrupted ones exactly.
#pragma once

#include <cstdint>
#include <vector>

namespace moecore {

template <typename Term>
double deterministic_sum(int64_t count, Term term) {
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = (c + 1) * kChunk < count ? (c + 1) * kChunk : count;
    double sum = 0.0;
    for (int64_t i = c * kChunk; i < end; ++i) sum += term(i);
    partial[static_cast<size_t>(c)] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace moecore
