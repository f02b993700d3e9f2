// The argument checks of cached (decoding) attention, shared by every backend.
#pragma once

#include <cstdint>

#include "kernels/view_checks.h"

namespace moecore::kernels {

struct CachedAttentionDims {
  int64_t n, heads, kv_heads, hd, keys;
};

// device: where the backend's kernel runs (every view must be there).
inline CachedAttentionDims cached_attention_dims(ConstTensorView q, ConstTensorView k_cache,
                                                 ConstTensorView v_cache, int64_t first_position,
                                                 ConstTensorView out,
                                                 Device device = Device::kCpu) {
  constexpr const char* kOp = "cached_attention";
  MOE_CHECK(q.rank() == 3 && k_cache.rank() == 3,
            "[{}] q must be [n, heads, hd] and k_cache [positions, kv_heads, hd], got ranks {}, {}",
            kOp, q.rank(), k_cache.rank());
  const CachedAttentionDims s{q.size(0), q.size(1), k_cache.size(1), q.size(2),
                              first_position + q.size(0)};
  MOE_CHECK(first_position >= 0, "[{}] first_position={} must be >= 0", kOp, first_position);
  MOE_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0,
            "[{}] kv_heads={} does not divide heads={}", kOp, s.kv_heads, s.heads);
  expect_shape(kOp, "q", q, {s.n, s.heads, s.hd}, device);
  expect_shape(kOp, "k_cache", k_cache, {s.keys, s.kv_heads, s.hd}, device);
  expect_shape(kOp, "v_cache", v_cache, {s.keys, s.kv_heads, s.hd}, device);
  expect_shape(kOp, "out", out, {s.n, s.heads, s.hd}, device);
  return s;
}

}  // namespace moecore::kernels
