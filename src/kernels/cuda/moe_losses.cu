// The losses from their statistics and the selection-bias step: kernels/moe_loss_rules.h's serial
// walk in one device thread (the CPU backend's too, so the same bits), on the device so that no
// pass waits for the host to read the statistics.
#include "kernels/cuda/launchers.h"
#include "kernels/moe_loss_rules.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void moe_loss_terms_kernel(const int64_t* counts, const double* sums, const double* head,
                                      int64_t layers, int64_t experts, int64_t head_chunks,
                                      MoeLossScalars scalars, double* losses, float* grad,
                                      double* tally) {
  moe_loss_terms_in_order(counts, sums, head, layers, experts, head_chunks, scalars, losses, grad,
                          tally);
}

__global__ void router_bias_update_kernel(const double* counts, int64_t experts, float rate,
                                          const float* step_factors, float* bias) {
  router_bias_update_in_order(counts, experts, rate, step_factors, bias);
}

}  // namespace

void launch_moe_loss_terms(const int64_t* route_counts, const double* router_sums,
                           const double* head_losses, int64_t layers, int64_t experts,
                           int64_t head_chunks, const MoeLossScalars& scalars, double* losses,
                           float* lb_score_grad, double* route_tally, cudaStream_t stream) {
  moe_loss_terms_kernel<<<1, 1, 0, stream>>>(route_counts, router_sums, head_losses, layers,
                                             experts, head_chunks, scalars, losses, lb_score_grad,
                                             route_tally);
}

void launch_router_bias_update(const double* counts, int64_t experts, float rate,
                               const float* step_factors, float* bias, cudaStream_t stream) {
  if (experts <= 0) return;
  router_bias_update_kernel<<<1, 1, 0, stream>>>(counts, experts, rate, step_factors, bias);
}

}  // namespace moecore::kernels::cuda
