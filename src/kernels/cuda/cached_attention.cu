// Cached (decoding) attention: one block per (query, head). The block's threads compute the
// scores of the keys in strides into shared memory, reduce their maximum and their sum of
// exponentials in a fixed order (block_reduce.cuh), and then each thread sums its output features
// over the keys in order: the result does not depend on scheduling. The CPU backend's expressions
// (kernels/cpu/cached_attention.cpp), so both round alike up to fused multiply-adds.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

constexpr int kThreads = 128;
// The reduction's warp values (block_reduce.cuh: 32 entries), the kernel's only static shared
// memory; it counts against the same per-block limits as the scores.
constexpr size_t kStaticSharedBytes = 32 * sizeof(float);

__global__ void cached_attention_kernel(const float* q, const float* k_cache, const float* v_cache,
                                        float* out, int64_t heads, int64_t kv_heads, int64_t hd,
                                        int64_t first_position, float scale) {
  extern __shared__ float scores[];  // [first_position + n]
  __shared__ float warp_values[kStaticSharedBytes / sizeof(float)];
  const int64_t i = blockIdx.x, h = blockIdx.y;
  const int64_t keys = first_position + i + 1, kvs = kv_heads * hd;
  const int64_t kv_off = (h / (heads / kv_heads)) * hd;
  const float* qi = q + (i * heads + h) * hd;
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    const float* kj = k_cache + j * kvs + kv_off;
    float dot = 0.0f;
    for (int64_t t = 0; t < hd; ++t) dot += qi[t] * kj[t];
    scores[j] = dot * scale;
    local_max = fmaxf(local_max, scores[j]);
  }
  const float max_val = block_reduce(local_max, MaxOp{}, -INFINITY, warp_values);
  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    const float e = expf(scores[j] - max_val);
    scores[j] = e;
    local_sum += e;
  }
  // block_reduce's barriers also make every thread's scores visible to all.
  const float inv_sum = 1.0f / block_reduce(local_sum, SumOp{}, 0.0f, warp_values);
  float* o = out + (i * heads + h) * hd;
  for (int64_t t = threadIdx.x; t < hd; t += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < keys; ++j) acc += scores[j] * inv_sum * v_cache[j * kvs + kv_off + t];
    o[t] = acc;
  }
}

}  // namespace

int64_t cached_attention_max_keys() {
  int device = 0, optin_bytes = 0;
  cudaFuncAttributes attributes{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaFuncGetAttributes(&attributes, cached_attention_kernel) != cudaSuccess) {
    cudaGetLastError();  // the caller's check reports the limit; leave no error behind
    return 0;
  }
  // The block's static shared memory (the reduction's warp values) comes out of the same limit.
  const int64_t dynamic_bytes =
      static_cast<int64_t>(optin_bytes) - static_cast<int64_t>(attributes.sharedSizeBytes);
  return dynamic_bytes > 0 ? dynamic_bytes / static_cast<int64_t>(sizeof(float)) : 0;
}

void launch_cached_attention_forward(const float* q, const float* k_cache, const float* v_cache,
                                     float* out, int64_t n, int64_t heads, int64_t kv_heads,
                                     int64_t hd, int64_t first_position, cudaStream_t stream) {
  if (n == 0 || heads == 0) return;
  const size_t shared_bytes = static_cast<size_t>(first_position + n) * sizeof(float);
  // Beyond the 48 KiB every block may have, static and dynamic together, the kernel opts in (a
  // driver call, made only then: a decode step launches this once per layer and token).
  if (!allow_dynamic_shared(cached_attention_kernel, shared_bytes, kStaticSharedBytes)) return;
  const dim3 grid(static_cast<unsigned int>(n), static_cast<unsigned int>(heads));
  cached_attention_kernel<<<grid, kThreads, shared_bytes, stream>>>(
      q, k_cache, v_cache, out, heads, kv_heads, hd, first_position,
      1.0f / sqrtf(static_cast<float>(hd)));
}

}  // namespace moecore::kernels::cuda
