// Cached (decoding) attention on the GPU (cached_attention.cu), checked as every backend checks
// it; the keys a query attends must fit the block's shared memory (one float each).
#include "kernels/cached_attention_checks.h"
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

void cached_attention_forward(ConstTensorView q, ConstTensorView k_cache, ConstTensorView v_cache,
                              int64_t first_position, TensorView out) {
  constexpr const char* kOp = "cached_attention";
  expect_on_device(kOp, "q", q);
  expect_on_device(kOp, "k_cache", k_cache);
  expect_on_device(kOp, "v_cache", v_cache);
  expect_on_device(kOp, "out", out);
  const CachedAttentionDims s =
      cached_attention_dims(q, k_cache, v_cache, first_position, out, Device::kCuda);
  const int64_t max_keys = cached_attention_max_keys();
  MOE_CHECK(s.keys <= max_keys,
            "[{}] {} keys do not fit the CUDA kernel's shared memory ({} at most on this GPU)", kOp,
            s.keys, max_keys);
  MOE_CHECK(s.n <= 2147483647 && s.heads <= 65535,
            "[{}] n={} and heads={} exceed the grid's extents", kOp, s.n, s.heads);
  launch_cached_attention_forward(q.data<float>(kOp), k_cache.data<float>(kOp),
                                  v_cache.data<float>(kOp), out.data<float>(kOp), s.n, s.heads,
                                  s.kv_heads, s.hd, first_position, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_cached_attention_forward");
}

}  // namespace moecore::kernels::cuda
