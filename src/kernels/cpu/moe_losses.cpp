// The losses from their statistics and the selection-bias step on the CPU: the shared rules
// (kernels/moe_loss_rules.h) walked in one thread; the CUDA kernels run the same rules per row.
#include "kernels/cpu/ops.h"
#include "kernels/moe_loss_checks.h"
#include "kernels/moe_loss_rules.h"
#include "kernels/step_decision_checks.h"

namespace moecore::kernels::cpu {

void moe_loss_terms(ConstTensorView route_counts, ConstTensorView router_sums,
                    ConstTensorView head_losses, const MoeLossOptions& o, TensorView losses,
                    TensorView lb_score_grad, TensorView route_tally) {
  constexpr const char* kOp = "moe_loss_terms";
  const MoeLossDims d = moe_loss_dims(kOp, route_counts, router_sums, head_losses, o, losses,
                                      lb_score_grad, route_tally);
  moe_loss_terms_in_order(route_counts.data<int64_t>(kOp), router_sums.data<double>(kOp),
                          head_losses.data<double>(kOp), d.layers, d.experts, d.head_chunks,
                          {o.lb_over_all_layers, o.top_k, o.router_loss_div, o.tokens, o.z_rows,
                           o.aux_loss_coef, o.lb_groups},
                          losses.data<double>(kOp), lb_score_grad.data<float>(kOp),
                          view_given(route_tally) ? route_tally.data<double>(kOp) : nullptr);
}

void router_bias_update(ConstTensorView counts, float rate, ConstTensorView step_factors,
                        TensorView bias) {
  constexpr const char* kOp = "router_bias_update";
  const int64_t experts = router_bias_update_experts(kOp, counts, bias);
  expect_step_factors(kOp, step_factors);
  if (experts == 0) return;
  router_bias_update_in_order(counts.data<double>(kOp), experts, rate,
                              view_given(step_factors) ? step_factors.data<float>(kOp) : nullptr,
                              bias.data<float>(kOp));
}

}  // namespace moecore::kernels::cpu
