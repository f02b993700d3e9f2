// The oracle's table (kernels::reference::, this folder).
#include "kernels/backend.h"

namespace moecore::kernels {

const KernelBackend& reference_backend() {
  static const KernelBackend backend{
      .name = "reference",
      .mx_gemm_bit_exact = true,
      .matmul = &kernels::reference::matmul,
      .rmsnorm_forward = &kernels::reference::rmsnorm_forward,
      .rmsnorm_backward = &kernels::reference::rmsnorm_backward,
      .swiglu_forward = &kernels::reference::swiglu_forward,
      .swiglu_backward = &kernels::reference::swiglu_backward,
      .embedding_forward = &kernels::reference::embedding_forward,
      .embedding_backward = &kernels::reference::embedding_backward,
      .rope_forward = &kernels::reference::rope_forward,
      .rope_backward = &kernels::reference::rope_backward,
      .cross_entropy = &kernels::reference::cross_entropy,
      .adamw_update = &kernels::reference::adamw_update,
      .step_decision = &kernels::reference::step_decision,
      .sum_of_squares = &kernels::reference::sum_of_squares,
      .causal_attention_forward = &kernels::reference::causal_attention_forward,
      .causal_attention_backward = &kernels::reference::causal_attention_backward,
      .flash_attention_forward = &kernels::reference::flash_attention_forward,
      .flash_attention_backward = &kernels::reference::flash_attention_backward,
      .permute_rows = &kernels::reference::permute_rows,
      .permute_rows_backward = &kernels::reference::permute_rows_backward,
      .gather_rows = &kernels::reference::gather_rows,
      .moe_combine_forward = &kernels::reference::moe_combine_forward,
      .moe_combine_backward = &kernels::reference::moe_combine_backward,
      .order_routes_by_expert = &kernels::reference::order_routes_by_expert,
      .padded_dispatch_plan = &kernels::reference::padded_dispatch_plan,
      .router_topk_forward = &kernels::reference::router_topk_forward,
      .router_topk_backward = &kernels::reference::router_topk_backward,
      .router_z_loss = &kernels::reference::router_z_loss,
      .router_probability_column_sums = &kernels::reference::router_probability_column_sums,
      .route_counts_by_group = &kernels::reference::route_counts_by_group,
      .moe_loss_terms = &kernels::reference::moe_loss_terms,
      .router_bias_update = &kernels::reference::router_bias_update,
      .grouped_gemm_forward = &kernels::reference::grouped_gemm_forward,
      .grouped_gemm_backward = &kernels::reference::grouped_gemm_backward,
      .add = &kernels::reference::add,
      .scale = &kernels::reference::scale,
      .cached_attention_forward = &kernels::reference::cached_attention_forward,
      .to_bf16 = &kernels::reference::to_bf16,
      .mx_quantize = &kernels::reference::mx_quantize,
      .mx_quantize_transposed = &kernels::reference::mx_quantize_transposed,
      .mx_dequantize = &kernels::reference::mx_dequantize,
      .mx_matmul = &kernels::reference::mx_matmul,
      .mx_grouped_gemm_forward = &kernels::reference::mx_grouped_gemm_forward,
      .mx_grouped_gemm_backward_input = &kernels::reference::mx_grouped_gemm_backward_input,
  };
  return backend;
}

}  // namespace moecore::kernels
