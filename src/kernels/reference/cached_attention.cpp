// Cached (decoding) attention, the plain-loop oracle, in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cached_attention_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels::reference {

void cached_attention_forward(ConstTensorView q, ConstTensorView k_cache, ConstTensorView v_cache,
                              int64_t first_position, TensorView out) {
  const CachedAttentionDims s = cached_attention_dims(q, k_cache, v_cache, first_position, out);
  const float* qp = q.data<float>("cached_attention");
  const float* kp = k_cache.data<float>("cached_attention");
  const float* vp = v_cache.data<float>("cached_attention");
  float* op = out.data<float>("cached_attention");
  const int64_t group = s.heads / s.kv_heads;
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t keys = first_position + i + 1, kvh = h / group;
      std::vector<double> p(static_cast<size_t>(keys));
      double max_val = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0.0;
        for (int64_t t = 0; t < s.hd; ++t)
          dot += double{qp[(i * s.heads + h) * s.hd + t]} *
                 double{kp[(j * s.kv_heads + kvh) * s.hd + t]};
        p[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(s.hd));
        max_val = std::max(max_val, p[static_cast<size_t>(j)]);
      }
      double sum = 0.0;
      for (double& v : p) sum += v = std::exp(v - max_val);
      for (int64_t t = 0; t < s.hd; ++t) {
        double acc = 0.0;
        for (int64_t j = 0; j < keys; ++j)
          acc += p[static_cast<size_t>(j)] / sum * double{vp[(j * s.kv_heads + kvh) * s.hd + t]};
        op[(i * s.heads + h) * s.hd + t] = static_cast<float>(acc);
      }
    }
}

}  // namespace moecore::kernels::reference
