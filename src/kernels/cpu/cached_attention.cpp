// Cached (decoding) attention on the CPU: (query, head) pairs over the OpenMP pool when the work
// pays for the threads; each pair's scores, softmax and weighted sum in a fixed order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cached_attention_checks.h"
#include "kernels/cpu/ops.h"

namespace moecore::kernels::cpu {

void cached_attention_forward(ConstTensorView q, ConstTensorView k_cache, ConstTensorView v_cache,
                              int64_t first_position, TensorView out) {
  constexpr const char* kOp = "cached_attention";
  const CachedAttentionDims s = cached_attention_dims(q, k_cache, v_cache, first_position, out);
  const int64_t n = s.n, nh = s.heads, hd = s.hd, p0 = first_position;
  const int64_t group = nh / s.kv_heads, kvs = s.kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qp = q.data<float>(kOp);
  const float* kp = k_cache.data<float>(kOp);
  const float* vp = v_cache.data<float>(kOp);
  float* op = out.data<float>(kOp);
  // Threads only pay off for real work (long prefills); a decode step of a small model stays
  // serial.
  const bool parallel = n * nh * (p0 + n) * hd >= (int64_t{1} << 16);
#pragma omp parallel if (parallel)
  {
    std::vector<float> scores(static_cast<size_t>(p0 + n));
#pragma omp for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t keys = p0 + i + 1, kv_off = (h / group) * hd;
        const float* qi = qp + (i * nh + h) * hd;
        float max_val = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          const float* k = kp + j * kvs + kv_off;
          float dot = 0.0f;
          for (int64_t t = 0; t < hd; ++t) dot += qi[t] * k[t];
          scores[static_cast<size_t>(j)] = dot * scale;
          max_val = std::max(max_val, scores[static_cast<size_t>(j)]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < keys; ++j) {
          const float e = std::exp(scores[static_cast<size_t>(j)] - max_val);
          scores[static_cast<size_t>(j)] = e;
          sum += e;
        }
        const float inv_sum = 1.0f / sum;  // sum >= 1: the max term is exp(0)
        float* o = op + (i * nh + h) * hd;
        std::fill(o, o + hd, 0.0f);
        for (int64_t j = 0; j < keys; ++j) {
          const float p = scores[static_cast<size_t>(j)] * inv_sum;
          const float* v = vp + j * kvs + kv_off;
#pragma omp simd
          for (int64_t t = 0; t < hd; ++t) o[t] += p * v[t];
        }
      }
    }
  }
}

}  // namespace moecore::kernels::cpu
