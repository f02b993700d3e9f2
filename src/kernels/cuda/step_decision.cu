// The optimizer step's decision: kernels/step_decision_rules.h's serial walk in one device thread
// (the CPU backend's too, so the same bits), so that the update need not wait for the host.
#include "kernels/cuda/launchers.h"
#include "kernels/step_decision_rules.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void step_decision_kernel(const double* rows, int64_t row_count, const double* squares,
                                     StepDecisionScalars scalars, const double* limits,
                                     double* decision, float* step_factors) {
  step_decision_in_order(rows, row_count, squares, scalars, limits, decision, step_factors);
}

}  // namespace

void launch_step_decision(const double* loss_rows, int64_t rows, const double* squares,
                          const StepDecisionScalars& scalars, const double* limits,
                          double* decision, float* step_factors, cudaStream_t stream) {
  step_decision_kernel<<<1, 1, 0, stream>>>(loss_rows, rows, squares, scalars, limits, decision,
                                            step_factors);
}

}  // namespace moecore::kernels::cuda
