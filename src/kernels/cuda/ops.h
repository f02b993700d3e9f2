// The CUDA backend's operations: kernels/op_declarations.inc's declarations once more, in
// kernels::cuda, on device views (Device::kCuda; a host view is an error naming the operation).
// Each operation is issued on runtime.h's stream and returns without waiting for it, except the
// grouped GEMMs, which issue one cuBLASLt GEMM per expert from the host and so read the expert
// offsets back (expert_offsets_on_host.h), but in a stream being captured into a CUDA graph: there
// the bf16 and MX ones run the device-offset kernels (grouped_gemm_device.h; MX on operands
// dequantised to bf16), and fp32 refuses in one line.
// Those that take row numbers or token ids held in device memory (embedding, permute_rows,
// permute_rows_backward, gather_rows, moe_combine) check them as the CPU backend does, but on the
// device: an index outside its tensor is recorded there and thrown by the next synchronize()
// (index_checks.h), and their kernels leave such a row alone. router_topk_forward's counts, the
// losses' statistics (router_z_loss, router_probability_column_sums, route_counts_by_group,
// cross_entropy's loss) and order_routes_by_expert's offsets stay on the device; none of the last
// three checks its indices (cross_entropy counts a target outside the vocabulary as ignored,
// route_counts_by_group an out-of-range expert in none, order_routes_by_expert gives an
// out-of-range id dst_row -1, kernels/op_declarations.inc), nor does padded_dispatch_plan,
// whose maps stay on the device too (it drops what its blocks cannot hold).
//
// Not every operation is here yet: cuda_backend() lists those that are (the others are null in
// its table, and the per-op harness reports them as not implemented).
//
// The MX operations: quantisation and dequantisation give the reference's bits; the MX GEMMs
// (mx_matmul, mx_grouped_gemm_forward, mx_grouped_gemm_backward_input) do NOT: on Hopper they
// dequantise to bf16 and sum the exact products in cuBLASLt's order (mx_gemm.cpp), within an fp32
// summation error of the reference (cuda_backend().mx_gemm_bit_exact is false).
#pragma once

#include "kernels/backend.h"
#include "kernels/ops.h"

namespace moecore::kernels::cuda {
#include "kernels/op_declarations.inc"
}  // namespace moecore::kernels::cuda

namespace moecore::kernels {

// The CUDA backend's table (kernels/cuda/backend.cpp), on device views.
const KernelBackend& cuda_backend();

}  // namespace moecore::kernels
