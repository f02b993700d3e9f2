// The CPU backend's table (kernels::cpu, kernels/cpu/ops.h: the operations of this folder).
#include "kernels/backend.h"

#include "kernels/cpu/ops.h"

namespace moecore::kernels {

const KernelBackend& cpu_backend() {
  static const KernelBackend backend{
      .name = "cpu",
      .mx_gemm_bit_exact = true,
      .matmul = &cpu::matmul,
      .rmsnorm_forward = &cpu::rmsnorm_forward,
      .rmsnorm_backward = &cpu::rmsnorm_backward,
      .swiglu_forward = &cpu::swiglu_forward,
      .swiglu_backward = &cpu::swiglu_backward,
      .embedding_forward = &cpu::embedding_forward,
      .embedding_backward = &cpu::embedding_backward,
      .rope_forward = &cpu::rope_forward,
      .rope_backward = &cpu::rope_backward,
      .cross_entropy = &cpu::cross_entropy,
      .adamw_update = &cpu::adamw_update,
      .step_decision = &cpu::step_decision,
      .sum_of_squares = &cpu::sum_of_squares,
      .causal_attention_forward = &cpu::causal_attention_forward,
      .causal_attention_backward = &cpu::causal_attention_backward,
      .flash_attention_forward = &cpu::flash_attention_forward,
      .flash_attention_backward = &cpu::flash_attention_backward,
      .permute_rows = &cpu::permute_rows,
      .permute_rows_backward = &cpu::permute_rows_backward,
      .gather_rows = &cpu::gather_rows,
      .moe_combine_forward = &cpu::moe_combine_forward,
      .moe_combine_backward = &cpu::moe_combine_backward,
      .order_routes_by_expert = &cpu::order_routes_by_expert,
      .padded_dispatch_plan = &cpu::padded_dispatch_plan,
      .router_topk_forward = &cpu::router_topk_forward,
      .router_topk_backward = &cpu::router_topk_backward,
      .router_z_loss = &cpu::router_z_loss,
      .router_probability_column_sums = &cpu::router_probability_column_sums,
      .route_counts_by_group = &cpu::route_counts_by_group,
      .moe_loss_terms = &cpu::moe_loss_terms,
      .router_bias_update = &cpu::router_bias_update,
      .grouped_gemm_forward = &cpu::grouped_gemm_forward,
      .grouped_gemm_backward = &cpu::grouped_gemm_backward,
      .add = &cpu::add,
      .scale = &cpu::scale,
      .cached_attention_forward = &cpu::cached_attention_forward,
      .to_bf16 = &cpu::to_bf16,
      .mx_quantize = &cpu::mx_quantize,
      .mx_quantize_transposed = &cpu::mx_quantize_transposed,
      .mx_dequantize = &cpu::mx_dequantize,
      .mx_matmul = &cpu::mx_matmul,
      .mx_grouped_gemm_forward = &cpu::mx_grouped_gemm_forward,
      .mx_grouped_gemm_backward_input = &cpu::mx_grouped_gemm_backward_input,
  };
  return backend;
}

}  // namespace moecore::kernels
