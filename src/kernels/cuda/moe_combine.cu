// The MoE combine. Forward: one block per token, its threads over the columns (four at a time,
// 16-byte loads, when every row starts 16-byte aligned), the token's routes added in slot order
// with the CPU's roundings (_rn: no fma contraction), so the bits match the CPU's. Backward: one
// block per route, writing its d_routed row and reducing its d_weights dot product in a fixed tree
// (no atomics). A row number outside routed writes nothing and reads NaN: the operations check
// row numbers before launching, and this keeps a missed one out of other memory.
#include <math_constants.h>

#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/row_packs.cuh"

namespace moecore::kernels::cuda {
namespace {

template <int kWidth>
__global__ void combine_forward_kernel(const float* routed, int64_t routed_rows,
                                       const int32_t* route_row, const float* weights,
                                       int64_t tokens, int64_t k, int64_t d, float* y) {
  const int64_t packs = d / kWidth;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    auto* yt = reinterpret_cast<Pack<kWidth>*>(y + t * d);
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
      Pack<kWidth> sum = yt[c];
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = route_row[t * k + j];
        const float weight = weights[t * k + j];
        if (row_inside(row, routed_rows)) {
          const Pack<kWidth> o =
              reinterpret_cast<const Pack<kWidth>*>(routed + int64_t{row} * d)[c];
          for (int l = 0; l < kWidth; ++l)
            sum.v[l] = __fadd_rn(sum.v[l], __fmul_rn(weight, o.v[l]));
        } else {
          for (int l = 0; l < kWidth; ++l) sum.v[l] = CUDART_NAN_F;
        }
      }
      yt[c] = sum;
    }
  }
}

template <int kWidth>
__global__ void combine_backward_kernel(const float* dy, const float* routed, int64_t routed_rows,
                                        const int32_t* route_row, const float* weights,
                                        int64_t routes, int64_t k, int64_t d, float* d_routed,
                                        float* d_weights) {
  __shared__ float warp_sums[32];
  const int64_t packs = d / kWidth;
  for (int64_t r = blockIdx.x; r < routes; r += gridDim.x) {
    const int32_t row = route_row[r];
    const float weight = weights[r];
    const auto* dyt = reinterpret_cast<const Pack<kWidth>*>(dy + (r / k) * d);
    float dot = 0.0f;
    // Uniform over the block: every thread reads the same row number.
    if (row_inside(row, routed_rows)) {
      const auto* o = reinterpret_cast<const Pack<kWidth>*>(routed + int64_t{row} * d);
      auto* g = reinterpret_cast<Pack<kWidth>*>(d_routed + int64_t{row} * d);
      for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
        const Pack<kWidth> dyv = dyt[c], ov = o[c];
        Pack<kWidth> gv;
        for (int l = 0; l < kWidth; ++l) {
          gv.v[l] = weight * dyv.v[l];
          dot = fmaf(dyv.v[l], ov.v[l], dot);
        }
        g[c] = gv;
      }
    } else {
      dot = CUDART_NAN_F;
    }
    dot = block_reduce(dot, SumOp{}, 0.0f, warp_sums);
    if (threadIdx.x == 0) d_weights[r] = dot;
  }
}

}  // namespace

void launch_moe_combine_forward(const float* routed, int64_t routed_rows, const int32_t* route_row,
                                const float* weights, int64_t tokens, int64_t k, int64_t d,
                                float* y, cudaStream_t stream) {
  if (tokens <= 0 || k <= 0 || d <= 0) return;
  if (d % 4 == 0 && aligned16(routed) && aligned16(y))
    combine_forward_kernel<4><<<row_blocks(tokens), pack_threads(d / 4), 0, stream>>>(
        routed, routed_rows, route_row, weights, tokens, k, d, y);
  else
    combine_forward_kernel<1><<<row_blocks(tokens), pack_threads(d), 0, stream>>>(
        routed, routed_rows, route_row, weights, tokens, k, d, y);
}

void launch_moe_combine_backward(const float* dy, const float* routed, int64_t routed_rows,
                                 const int32_t* route_row, const float* weights, int64_t tokens,
                                 int64_t k, int64_t d, float* d_routed, float* d_weights,
                                 cudaStream_t stream) {
  // With d = 0 there is still work: every d_weights entry is an empty dot product, 0.
  const int64_t routes = tokens * k;
  if (routes <= 0) return;
  if (d % 4 == 0 && aligned16(dy) && aligned16(routed) && aligned16(d_routed))
    combine_backward_kernel<4><<<row_blocks(routes), pack_threads(d / 4), 0, stream>>>(
        dy, routed, routed_rows, route_row, weights, routes, k, d, d_routed, d_weights);
  else
    combine_backward_kernel<1><<<row_blocks(routes), pack_threads(d), 0, stream>>>(
        dy, routed, routed_rows, route_row, weights, routes, k, d, d_routed, d_weights);
}

}  // namespace moecore::kernels::cuda
