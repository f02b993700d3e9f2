// The argument checks of RoPE, shared by every backend: x [batch, seq, heads, head_dim] with an
// even head_dim, cos and sin [positions, head_dim / 2] covering positions [first_position,
// first_position + seq).
#pragma once

#include <cstdint>

#include "kernels/view_checks.h"

namespace moecore::kernels {

struct RopeDims {
  int64_t batch, seq, heads, half;
};

inline RopeDims rope_dims(const char* op, ConstTensorView x, ConstTensorView cos,
                          ConstTensorView sin, int64_t first_position,
                          Device device = Device::kCpu) {
  MOE_CHECK(x.rank() == 4, "[{}] x must be [batch, seq, heads, head_dim], got rank {}", op,
            x.rank());
  const int64_t batch = x.size(0), seq = x.size(1), n_heads = x.size(2), head_dim = x.size(3);
  MOE_CHECK(head_dim % 2 == 0, "[{}] head_dim={} must be even", op, head_dim);
  const int64_t half = head_dim / 2;
  MOE_CHECK(cos.rank() == 2, "[{}] cos must be [positions, head_dim / 2], got rank {}", op,
            cos.rank());
  const int64_t positions = cos.size(0);
  expect_shape(op, "x", x, {batch, seq, n_heads, head_dim}, device);
  expect_shape(op, "cos", cos, {positions, half}, device);
  expect_shape(op, "sin", sin, {positions, half}, device);
  MOE_CHECK(first_position >= 0 && first_position + seq <= positions,
            "[{}] positions [{}, {}) exceed the table's {} positions", op, first_position,
            first_position + seq, positions);
  return {batch, seq, n_heads, half};
}

}  // namespace moecore::kernels
