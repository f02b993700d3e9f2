// A kernel backend as a table of its operations, for the per-op harness
// (tests/cpp/test_kernel_ops.cpp): the harness runs every case against every registered table and
// compares it with reference_backend(). Model code never goes through this table; it calls the
// declarations of kernels/ops.h, which the backend compiled in defines.
#pragma once

#include <string_view>

#include "kernels/ops.h"

namespace moecore::kernels {

struct KernelBackend {
  std::string_view name;
  // Whether the MX GEMMs (mx_matmul, mx_grouped_gemm_forward, mx_grouped_gemm_backward_input) give
  // the reference's bits: true where they sum in its fixed order (kernels/reference/mx_gemm.h);
  // false where they sum the same exact products in another order (the CUDA backend's cuBLASLt
  // GEMMs on bf16-dequantised operands), so that the harness compares them by NMSE instead. MX
  // quantisation and dequantisation are bit-exact on every backend.
  bool mx_gemm_bit_exact;
  decltype(&kernels::matmul) matmul;
  decltype(&kernels::rmsnorm_forward) rmsnorm_forward;
  decltype(&kernels::rmsnorm_backward) rmsnorm_backward;
  decltype(&kernels::swiglu_forward) swiglu_forward;
  decltype(&kernels::swiglu_backward) swiglu_backward;
  decltype(&kernels::embedding_forward) embedding_forward;
  decltype(&kernels::embedding_backward) embedding_backward;
  decltype(&kernels::rope_forward) rope_forward;
  decltype(&kernels::rope_backward) rope_backward;
  decltype(&kernels::cross_entropy) cross_entropy;
  decltype(&kernels::adamw_update) adamw_update;
  decltype(&kernels::step_decision) step_decision;
  decltype(&kernels::sum_of_squares) sum_of_squares;
  decltype(&kernels::causal_attention_forward) causal_attention_forward;
  decltype(&kernels::causal_attention_backward) causal_attention_backward;
  decltype(&kernels::flash_attention_forward) flash_attention_forward;
  decltype(&kernels::flash_attention_backward) flash_attention_backward;
  decltype(&kernels::permute_rows) permute_rows;
  decltype(&kernels::permute_rows_backward) permute_rows_backward;
  decltype(&kernels::gather_rows) gather_rows;
  decltype(&kernels::moe_combine_forward) moe_combine_forward;
  decltype(&kernels::moe_combine_backward) moe_combine_backward;
  decltype(&kernels::order_routes_by_expert) order_routes_by_expert;
  decltype(&kernels::padded_dispatch_plan) padded_dispatch_plan;
  decltype(&kernels::router_topk_forward) router_topk_forward;
  decltype(&kernels::router_topk_backward) router_topk_backward;
  decltype(&kernels::router_z_loss) router_z_loss;
  decltype(&kernels::router_probability_column_sums) router_probability_column_sums;
  decltype(&kernels::route_counts_by_group) route_counts_by_group;
  decltype(&kernels::moe_loss_terms) moe_loss_terms;
  decltype(&kernels::router_bias_update) router_bias_update;
  decltype(&kernels::grouped_gemm_forward) grouped_gemm_forward;
  decltype(&kernels::grouped_gemm_backward) grouped_gemm_backward;
  decltype(&kernels::add) add;
  decltype(&kernels::scale) scale;
  decltype(&kernels::cached_attention_forward) cached_attention_forward;
  decltype(&kernels::to_bf16) to_bf16;
  decltype(&kernels::mx_quantize) mx_quantize;
  decltype(&kernels::mx_quantize_transposed) mx_quantize_transposed;
  decltype(&kernels::mx_dequantize) mx_dequantize;
  decltype(&kernels::mx_matmul) mx_matmul;
  decltype(&kernels::mx_grouped_gemm_forward) mx_grouped_gemm_forward;
  decltype(&kernels::mx_grouped_gemm_backward_input) mx_grouped_gemm_backward_input;
};

// The plain-loop oracle (kernels/reference/).
const KernelBackend& reference_backend();

// The CPU backend (kernels/cpu/).
const KernelBackend& cpu_backend();

}  // namespace moecore::kernels
