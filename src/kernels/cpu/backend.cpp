// The CPU backend's table (the definitions of kernels/ops.h in this folder).
#include "kernels/backend.h"

namespace moecore::kernels {

const KernelBackend& cpu_backend() {
  static const KernelBackend backend{
      .name = "cpu",
      .mx_gemm_bit_exact = true,
      .matmul = &kernels::matmul,
      .rmsnorm_forward = &kernels::rmsnorm_forward,
      .rmsnorm_backward = &kernels::rmsnorm_backward,
      .swiglu_forward = &kernels::swiglu_forward,
      .swiglu_backward = &kernels::swiglu_backward,
      .embedding_forward = &kernels::embedding_forward,
      .embedding_backward = &kernels::embedding_backward,
      .rope_forward = &kernels::rope_forward,
      .rope_backward = &kernels::rope_backward,
      .cross_entropy = &kernels::cross_entropy,
      .adamw_update = &kernels::adamw_update,
      .sum_of_squares = &kernels::sum_of_squares,
      .causal_attention_forward = &kernels::causal_attention_forward,
      .causal_attention_backward = &kernels::causal_attention_backward,
      .flash_attention_forward = &kernels::flash_attention_forward,
      .flash_attention_backward = &kernels::flash_attention_backward,
      .permute_rows = &kernels::permute_rows,
      .permute_rows_backward = &kernels::permute_rows_backward,
      .gather_rows = &kernels::gather_rows,
      .moe_combine_forward = &kernels::moe_combine_forward,
      .moe_combine_backward = &kernels::moe_combine_backward,
      .order_routes_by_expert = &kernels::order_routes_by_expert,
      .router_topk_forward = &kernels::router_topk_forward,
      .router_topk_backward = &kernels::router_topk_backward,
      .router_z_loss = &kernels::router_z_loss,
      .router_probability_column_sums = &kernels::router_probability_column_sums,
      .grouped_gemm_forward = &kernels::grouped_gemm_forward,
      .grouped_gemm_backward = &kernels::grouped_gemm_backward,
      .add = &kernels::add,
      .scale = &kernels::scale,
      .cached_attention_forward = &kernels::cached_attention_forward,
      .to_bf16 = &kernels::to_bf16,
      .mx_quantize = &kernels::mx_quantize,
      .mx_quantize_transposed = &kernels::mx_quantize_transposed,
      .mx_dequantize = &kernels::mx_dequantize,
      .mx_matmul = &kernels::mx_matmul,
      .mx_grouped_gemm_forward = &kernels::mx_grouped_gemm_forward,
      .mx_grouped_gemm_backward_input = &kernels::mx_grouped_gemm_backward_input,
  };
  return backend;
}

}  // namespace moecore::kernels
