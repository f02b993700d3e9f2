// The threading policy of the CPU's grouped GEMMs (kernels/cpu/grouped_gemm.cpp and
// mx_grouped_gemm.cpp): with many rows per expert, one expert at a time with multithreaded GEMMs.
// With few (128 experts top-4 on 2048 tokens: ~64 rows each), each such GEMM is too small to split
// over the threads; its thread start-up and barriers cost more than the work. Then the experts run
// in parallel instead, each on one thread (a GEMM runs single-threaded inside a parallel region),
// biggest first so that the threads finish together. The policy depends only on the offsets and
// the thread count, so the GEMMs of a forward and of its backward see the same shapes and the same
// threading.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace moecore::kernels {

inline constexpr int64_t kRowsPerThreadedExpert = 256;

// Experts with rows, biggest first; empty when one expert at a time is the better choice.
inline std::vector<int64_t> parallel_expert_order(std::span<const int64_t> offsets,
                                                  int64_t experts) {
  auto at = [](int64_t i) { return static_cast<size_t>(i); };
  std::vector<int64_t> order;
  for (int64_t e = 0; e < experts; ++e)
    if (offsets[at(e + 1)] > offsets[at(e)]) order.push_back(e);
  const int64_t threads = omp_get_max_threads();
  if (threads <= 1 || order.size() < 2 || omp_in_parallel() != 0) return {};
  const int64_t rows = offsets[at(experts)];
  if (rows >= kRowsPerThreadedExpert * static_cast<int64_t>(order.size())) return {};
  auto rows_of = [&](int64_t e) { return offsets[at(e + 1)] - offsets[at(e)]; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rows_of(a) > rows_of(b); });
  return order;
}

// Runs expert(e) for every expert with rows, in whichever way parallel_expert_order picks.
template <typename F>
void for_each_expert(std::span<const int64_t> offsets, int64_t experts, F&& expert) {
  auto at = [](int64_t i) { return static_cast<size_t>(i); };
  const std::vector<int64_t> order = parallel_expert_order(offsets, experts);
  if (order.empty()) {
    for (int64_t e = 0; e < experts; ++e)
      if (offsets[at(e + 1)] > offsets[at(e)]) expert(e);
    return;
  }
  const int64_t n = static_cast<int64_t>(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) expert(order[at(i)]);
}

}  // namespace moecore::kernels
