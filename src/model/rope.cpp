#include "model/rope.h"

#include <cmath>

#include "core/check.h"

namespace moecore {

RopeTable RopeTable::build(int64_t max_positions, int64_t head_dim, double theta) {
  // Output: cos, sin [max_positions, head_dim/2].
  MOE_CHECK(head_dim > 0 && head_dim % 2 == 0, "[rope] head_dim={} must be positive and even",
            head_dim);
  MOE_CHECK(max_positions > 0, "[rope] max_positions={} must be positive", max_positions);
  MOE_CHECK(theta > 0.0, "[rope] rope_theta={} must be positive", theta);
  const int64_t half = head_dim / 2;
  RopeTable table;
  table.max_positions = max_positions;
  table.head_dim = head_dim;
  table.cos.resize(static_cast<size_t>(max_positions * half));
  table.sin.resize(static_cast<size_t>(max_positions * half));

  // HF: inv_freq = 1.0 / (base ** (arange(0, dim, 2, int64).float() / dim)). The exponent is a
  // float32 division, the power a float32 pow (torch promotes the python-float base to the
  // tensor's float32), and the reciprocal a float32 division; mirror each rounding step.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(base, exponent);
  }

  // HF: freqs = inv_freq (float32) @ position_ids (float32), a k=1 matmul, i.e. one float32
  // product per entry; cos/sin of that float32 angle. Evaluating cos/sin in double and rounding
  // once gives the correctly rounded float, which is what torch's float kernels approximate
  // (they may differ by an ulp).
  for (int64_t t = 0; t < max_positions; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq[static_cast<size_t>(i)];
      const size_t idx = static_cast<size_t>(t * half + i);
      table.cos[idx] = static_cast<float>(std::cos(static_cast<double>(angle)));
      table.sin[idx] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return table;
}

namespace {

void check_rope_args(const char* op, const float* x, int64_t batch, int64_t seq, int64_t n_heads,
                     int64_t head_dim, const RopeTable& table) {
  MOE_CHECK(batch > 0 && seq > 0 && n_heads > 0,
            "[{}] batch={} seq={} n_heads={} must all be positive", op, batch, seq, n_heads);
  MOE_CHECK(head_dim == table.head_dim, "[{}] head_dim={} does not match the table's head_dim={}",
            op, head_dim, table.head_dim);
  MOE_CHECK(seq <= table.max_positions, "[{}] seq={} exceeds the table's max_positions={}", op, seq,
            table.max_positions);
  MOE_CHECK(x != nullptr, "[{}] null input", op);
}

// Applies, to every head vector of x, the per-pair rotation by +angle (sign = +1, forward) or by
// -angle (sign = -1, backward: the transpose of a rotation is the rotation by the opposite angle).
// One template instead of two copies so forward and backward cannot drift apart.
template <int kSign>
void rotate(float* x, int64_t batch, int64_t seq, int64_t n_heads, int64_t head_dim,
            const RopeTable& table) {
  const int64_t half = head_dim / 2;
  // (b, t) pairs are independent; heads of one position share a cos/sin row, so keep them inside.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const float* cos_t = table.cos.data() + t * half;
      const float* sin_t = table.sin.data() + t * half;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* lo = x + ((b * seq + t) * n_heads + h) * head_dim;
        float* hi = lo + half;
        // Same expression order as HF (x * cos + rotate_half(x) * sin) to stay bit-close to it.
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float c = cos_t[i];
          const float s = kSign > 0 ? sin_t[i] : -sin_t[i];
          const float x_lo = lo[i];
          const float x_hi = hi[i];
          lo[i] = x_lo * c + (-x_hi) * s;
          hi[i] = x_hi * c + x_lo * s;
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, int64_t batch, int64_t seq, int64_t n_heads, int64_t head_dim,
                  const RopeTable& table) {
  // x: [batch, seq, n_heads, head_dim] -> same shape, rotated by position.
  check_rope_args("rope", x, batch, seq, n_heads, head_dim, table);
  rotate<+1>(x, batch, seq, n_heads, head_dim, table);
}

void rope_backward(float* dx, int64_t batch, int64_t seq, int64_t n_heads, int64_t head_dim,
                   const RopeTable& table) {
  // dx: [batch, seq, n_heads, head_dim] (dL/dout in) -> same shape (dL/dx out).
  check_rope_args("rope_backward", dx, batch, seq, n_heads, head_dim, table);
  rotate<-1>(dx, batch, seq, n_heads, head_dim, table);
}

}  // namespace moecore
