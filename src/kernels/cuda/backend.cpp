// The CUDA backend's table. Null entries are operations not written for the GPU: the causal
// attention pair (the model's attention is the flash pair, which saves a logsumexp instead of the
// T x T probabilities); the per-op harness skips their cases, naming them.
#include "kernels/cuda/ops.h"

namespace moecore::kernels {

const KernelBackend& cuda_backend() {
  static const KernelBackend backend{
      .name = "cuda",
      .mx_gemm_bit_exact = false,  // cuBLASLt sums in its own order (mx_gemm.cpp)
      .matmul = &cuda::matmul,
      .rmsnorm_forward = &cuda::rmsnorm_forward,
      .rmsnorm_backward = &cuda::rmsnorm_backward,
      .swiglu_forward = &cuda::swiglu_forward,
      .swiglu_backward = &cuda::swiglu_backward,
      .embedding_forward = &cuda::embedding_forward,
      .embedding_backward = &cuda::embedding_backward,
      .rope_forward = &cuda::rope_forward,
      .rope_backward = &cuda::rope_backward,
      .cross_entropy = &cuda::cross_entropy,
      .adamw_update = &cuda::adamw_update,
      .step_decision = &cuda::step_decision,
      .sum_of_squares = &cuda::sum_of_squares,
      .causal_attention_forward = nullptr,
      .causal_attention_backward = nullptr,
      .flash_attention_forward = &cuda::flash_attention_forward,
      .flash_attention_backward = &cuda::flash_attention_backward,
      .permute_rows = &cuda::permute_rows,
      .permute_rows_backward = &cuda::permute_rows_backward,
      .gather_rows = &cuda::gather_rows,
      .moe_combine_forward = &cuda::moe_combine_forward,
      .moe_combine_backward = &cuda::moe_combine_backward,
      .order_routes_by_expert = &cuda::order_routes_by_expert,
      .padded_dispatch_plan = &cuda::padded_dispatch_plan,
      .router_topk_forward = &cuda::router_topk_forward,
      .router_topk_backward = &cuda::router_topk_backward,
      .router_z_loss = &cuda::router_z_loss,
      .router_probability_column_sums = &cuda::router_probability_column_sums,
      .route_counts_by_group = &cuda::route_counts_by_group,
      .moe_loss_terms = &cuda::moe_loss_terms,
      .router_bias_update = &cuda::router_bias_update,
      .grouped_gemm_forward = &cuda::grouped_gemm_forward,
      .grouped_gemm_backward = &cuda::grouped_gemm_backward,
      .add = &cuda::add,
      .scale = &cuda::scale,
      .cached_attention_forward = &cuda::cached_attention_forward,
      .to_bf16 = &cuda::to_bf16,
      .mx_quantize = &cuda::mx_quantize,
      .mx_quantize_transposed = &cuda::mx_quantize_transposed,
      .mx_dequantize = &cuda::mx_dequantize,
      .mx_matmul = &cuda::mx_matmul,
      .mx_grouped_gemm_forward = &cuda::mx_grouped_gemm_forward,
      .mx_grouped_gemm_backward_input = &cuda::mx_grouped_gemm_backward_input,
  };
  return backend;
}

}  // namespace moecore::kernels
