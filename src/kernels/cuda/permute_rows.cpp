// Routed-row permutations on the GPU (permute_rows.cu), checked as the CPU backend checks them.
// The row numbers are device data: their check is queued with the kernels and an out-of-range one
// is reported at the next synchronisation (index_checks.h), so these never wait for the stream.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/index_checks.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

void permute_rows(ConstTensorView src, ConstTensorView dst_row, int64_t routes_per_row,
                  TensorView dst) {
  constexpr const char* kOp = "permute_rows";
  expect_on_device(kOp, "src", src);
  expect_on_device(kOp, "dst_row", dst_row);
  MOE_CHECK(dst.rank() == 2 && routes_per_row > 0,
            "[{}] dst must be [rows, d] and routes_per_row={} positive", kOp, routes_per_row);
  const int64_t routes = dst_row.size(0), d = dst.size(1);
  MOE_CHECK(routes % routes_per_row == 0, "[{}] {} routes are not {} per source row", kOp, routes,
            routes_per_row);
  expect_shape(kOp, "dst_row", dst_row, {routes}, Device::kCuda);
  expect_shape(kOp, "src", src, {routes / routes_per_row, d}, Device::kCuda);
  expect_shape(kOp, "dst", dst, {dst.size(0), d}, Device::kCuda);
  const float* s = src.data<float>(kOp);
  const int32_t* to = dst_row.data<int32_t>(kOp);
  float* out = dst.data<float>(kOp);
  check_indices_inside(kOp, "dst_row", to, routes, dst.size(0));
  launch_permute_rows(s, to, routes, routes_per_row, d, out, dst.size(0), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_permute_rows");
}

void permute_rows_backward(ConstTensorView d_dst, ConstTensorView dst_row, int64_t routes_per_row,
                           TensorView d_src) {
  constexpr const char* kOp = "permute_rows_backward";
  expect_on_device(kOp, "d_dst", d_dst);
  expect_on_device(kOp, "dst_row", dst_row);
  MOE_CHECK(d_src.rank() == 2 && routes_per_row > 0,
            "[{}] d_src must be [rows, d] and routes_per_row={} positive", kOp, routes_per_row);
  const int64_t tokens = d_src.size(0), d = d_src.size(1), k = routes_per_row;
  expect_shape(kOp, "dst_row", dst_row, {tokens * k}, Device::kCuda);
  expect_shape(kOp, "d_dst", d_dst, {d_dst.size(0), d}, Device::kCuda);
  expect_shape(kOp, "d_src", d_src, {tokens, d}, Device::kCuda);
  const float* g = d_dst.data<float>(kOp);
  const int32_t* from = dst_row.data<int32_t>(kOp);
  float* dx = d_src.data<float>(kOp);
  check_indices_inside(kOp, "dst_row", from, tokens * k, d_dst.size(0));
  launch_permute_rows_backward(g, d_dst.size(0), from, tokens, k, d, dx, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_permute_rows_backward");
}

void gather_rows(ConstTensorView src, ConstTensorView src_row, TensorView dst) {
  constexpr const char* kOp = "gather_rows";
  expect_on_device(kOp, "src", src);
  expect_on_device(kOp, "src_row", src_row);
  MOE_CHECK(dst.rank() == 2, "[{}] dst must be [rows, d], got rank {}", kOp, dst.rank());
  const int64_t rows = dst.size(0), d = dst.size(1);
  expect_shape(kOp, "src_row", src_row, {rows}, Device::kCuda);
  expect_shape(kOp, "src", src, {src.size(0), d}, Device::kCuda);
  expect_shape(kOp, "dst", dst, {rows, d}, Device::kCuda);
  const float* s = src.data<float>(kOp);
  const int32_t* from = src_row.data<int32_t>(kOp);
  float* out = dst.data<float>(kOp);
  check_indices_inside(kOp, "src_row", from, rows, src.size(0), -1);
  launch_gather_rows(s, src.size(0), from, rows, d, out, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_gather_rows");
}

}  // namespace moecore::kernels::cuda
