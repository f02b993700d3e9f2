// The losses from their statistics and the selection-bias step: kernels/moe_loss_rules.h's rules
// (the CPU backend's too, so the same bits), on the device so that no pass waits for the host to
// read the statistics. A thread per load-balancing row and per tally value; one thread adds the
// rows' shares in order and the few per-layer and per-chunk values.
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/moe_loss_rules.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void lb_rows_kernel(const int64_t* counts, const double* sums, int64_t layers,
                               int64_t experts, MoeLossScalars scalars, int64_t rows, float* grad,
                               double* shares) {
  for (int64_t r = grid_first(); r < rows; r += grid_stride())
    shares[r] = lb_row_in_order(counts, sums, layers, experts, scalars, r, grad);
}

__global__ void tally_kernel(const int64_t* counts, int64_t values, int64_t experts, int64_t groups,
                             double* tally) {
  for (int64_t i = grid_first(); i < values; i += grid_stride())
    moe_tally_value(counts, experts, groups, i, tally);
}

__global__ void loss_parts_kernel(const double* sums, const double* head, int64_t layers,
                                  int64_t experts, int64_t head_chunks, MoeLossScalars scalars,
                                  const double* shares, int64_t rows, double* losses) {
  double lb = 0.0;
  for (int64_t r = 0; r < rows; ++r) lb += shares[r];
  moe_loss_parts_in_order(sums, head, layers, experts, head_chunks, scalars, lb, losses);
}

__global__ void router_bias_update_kernel(const double* counts, int64_t experts, float rate,
                                          const float* step_factors, float* bias) {
  router_bias_update_in_order(counts, experts, rate, step_factors, bias);
}

}  // namespace

void launch_moe_loss_terms(const int64_t* route_counts, const double* router_sums,
                           const double* head_losses, int64_t layers, int64_t experts,
                           int64_t head_chunks, const MoeLossScalars& scalars, double* losses,
                           float* lb_score_grad, double* route_tally, double* lb_shares,
                           cudaStream_t stream) {
  const int64_t rows = lb_row_count(layers, experts, scalars);
  if (rows > 0)
    lb_rows_kernel<<<elementwise_blocks(rows), kElementThreads, 0, stream>>>(
        route_counts, router_sums, layers, experts, scalars, rows, lb_score_grad, lb_shares);
  if (route_tally != nullptr && layers * experts > 0)
    tally_kernel<<<elementwise_blocks(layers * experts), kElementThreads, 0, stream>>>(
        route_counts, layers * experts, experts, scalars.lb_groups, route_tally);
  loss_parts_kernel<<<1, 1, 0, stream>>>(router_sums, head_losses, layers, experts, head_chunks,
                                         scalars, lb_shares, rows, losses);
}

void launch_router_bias_update(const double* counts, int64_t experts, float rate,
                               const float* step_factors, float* bias, cudaStream_t stream) {
  if (experts <= 0) return;
  router_bias_update_kernel<<<1, 1, 0, stream>>>(counts, experts, rate, step_factors, bias);
}

}  // namespace moecore::kernels::cuda
