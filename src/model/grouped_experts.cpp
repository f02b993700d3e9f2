#include "model/grouped_experts.h"

#include <omp.h>

#include <algorithm>

#include "core/to_size.h"
#include "model/swiglu_mlp.h"

namespace moecore {

namespace {

// The grouped GEMM runs in one of two ways. With many rows per expert, one expert at a time with
// multithreaded GEMMs. With few (128 experts top-4 on 2048 tokens: ~64 rows each), each such GEMM
// is too small to split over the threads; its thread start-up and barriers cost more than the work.
// Then the experts run in parallel instead, each on one thread (oneDNN runs single-threaded inside
// a parallel region, as does the SwiGLU's elementwise loop), biggest first so that the threads
// finish together. Either way each expert's rows see the same per-row arithmetic.
constexpr int64_t kRowsPerThreadedExpert = 256;

// Local experts with rows, biggest first; empty when one expert at a time is the better choice.
std::vector<int64_t> parallel_expert_order(const std::vector<int64_t>& offsets, int64_t local) {
  std::vector<int64_t> order;
  for (int64_t le = 0; le < local; ++le)
    if (offsets[to_size(le + 1)] > offsets[to_size(le)]) order.push_back(le);
  const int64_t threads = omp_get_max_threads();
  if (threads <= 1 || order.size() < 2 || omp_in_parallel() != 0) return {};
  const int64_t rows = offsets[to_size(local)];
  if (rows >= kRowsPerThreadedExpert * static_cast<int64_t>(order.size())) return {};
  auto rows_of = [&](int64_t le) { return offsets[to_size(le + 1)] - offsets[to_size(le)]; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rows_of(a) > rows_of(b); });
  return order;
}

// Runs expert(le) for every local expert with rows, in whichever way parallel_expert_order picks.
template <typename F>
void for_each_expert(const std::vector<int64_t>& offsets, int64_t local, F&& expert) {
  const std::vector<int64_t> order = parallel_expert_order(offsets, local);
  if (order.empty()) {
    for (int64_t le = 0; le < local; ++le)
      if (offsets[to_size(le + 1)] > offsets[to_size(le)]) expert(le);
    return;
  }
  const int64_t n = static_cast<int64_t>(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) expert(order[to_size(i)]);
}

}  // namespace

void grouped_experts_forward(const ModelConfig& c, int64_t local, const MoeWeights& w,
                             ExpertRows& rows, float* y) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  for_each_expert(rows.expert_offsets, local, [&](int64_t le) {
    const int64_t begin = rows.expert_offsets[to_size(le)];
    const int64_t count = rows.expert_offsets[to_size(le + 1)] - begin;
    swiglu_mlp_forward({count, d, h}, rows.x.data() + begin * d, w.experts_gate_up + le * 2 * h * d,
                       w.experts_down + le * d * h, rows.gu.data() + begin * 2 * h,
                       rows.act.data() + begin * h, y + begin * d);
  });
}

void grouped_experts_backward(const ModelConfig& c, int64_t local, const MoeWeights& w,
                              const MoeWeights& dw, const ExpertRows& rows, const float* dy,
                              float* dx) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.expert_offsets[to_size(local)];
  std::vector<float> scratch_dact(to_size(received * h));
  std::vector<float> scratch_dgu(to_size(received * 2 * h));
  for_each_expert(rows.expert_offsets, local, [&](int64_t le) {
    const int64_t begin = rows.expert_offsets[to_size(le)];
    const int64_t count = rows.expert_offsets[to_size(le + 1)] - begin;
    swiglu_mlp_backward({count, d, h}, dy + begin * d, rows.x.data() + begin * d,
                        w.experts_gate_up + le * 2 * h * d, w.experts_down + le * d * h,
                        rows.gu.data() + begin * 2 * h, rows.act.data() + begin * h, dx + begin * d,
                        dw.experts_gate_up + le * 2 * h * d, dw.experts_down + le * d * h,
                        scratch_dact.data() + begin * h, scratch_dgu.data() + begin * 2 * h, false);
  });
}

}  // namespace moecore
