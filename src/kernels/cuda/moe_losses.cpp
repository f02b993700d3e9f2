// The losses from their statistics and the selection-bias step on the GPU (moe_losses.cu): the
// losses and the router's loss gradient stay on the device.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/moe_loss_checks.h"
#include "kernels/moe_loss_rules.h"
#include "kernels/step_decision_checks.h"

namespace moecore::kernels::cuda {

void moe_loss_terms(ConstTensorView route_counts, ConstTensorView router_sums,
                    ConstTensorView head_losses, const MoeLossOptions& o, TensorView losses,
                    TensorView lb_score_grad, TensorView route_tally) {
  constexpr const char* kOp = "moe_loss_terms";
  expect_on_device(kOp, "route_counts", route_counts);
  expect_on_device(kOp, "router_sums", router_sums);
  expect_on_device(kOp, "head_losses", head_losses);
  expect_on_device(kOp, "losses", losses);
  expect_on_device(kOp, "lb_score_grad", lb_score_grad);
  expect_on_device(kOp, "route_tally", route_tally);
  const MoeLossDims d = moe_loss_dims(kOp, route_counts, router_sums, head_losses, o, losses,
                                      lb_score_grad, route_tally, Device::kCuda);
  const MoeLossScalars scalars{
      o.lb_over_all_layers, o.top_k,    o.router_loss_div, o.tokens, o.z_rows,
      o.aux_loss_coef,      o.lb_groups};
  const StreamScratch lb_shares(
      sizeof(double) * static_cast<size_t>(lb_row_count(d.layers, d.experts, scalars)), stream());
  launch_moe_loss_terms(route_counts.data<int64_t>(kOp), router_sums.data<double>(kOp),
                        head_losses.data<double>(kOp), d.layers, d.experts, d.head_chunks, scalars,
                        losses.data<double>(kOp), lb_score_grad.data<float>(kOp),
                        view_given(route_tally) ? route_tally.data<double>(kOp) : nullptr,
                        lb_shares.as<double>(), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_moe_loss_terms");
}

void router_bias_update(ConstTensorView counts, float rate, ConstTensorView step_factors,
                        TensorView bias) {
  constexpr const char* kOp = "router_bias_update";
  expect_on_device(kOp, "counts", counts);
  expect_on_device(kOp, "step_factors", step_factors);
  expect_on_device(kOp, "bias", bias);
  const int64_t experts = router_bias_update_experts(kOp, counts, bias, Device::kCuda);
  expect_step_factors(kOp, step_factors, Device::kCuda);
  if (experts == 0) return;
  launch_router_bias_update(counts.data<double>(kOp), experts, rate,
                            view_given(step_factors) ? step_factors.data<float>(kOp) : nullptr,
                            bias.data<float>(kOp), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_router_bias_update");
}

}  // namespace moecore::kernels::cuda
