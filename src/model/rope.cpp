#include "model/rope.h"

#include <cmath>
#include <vector>

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
  std::vector<float> cos(static_cast<size_t>(max_positions * half));
  std::vector<float> sin(cos.size());

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
      cos[idx] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[idx] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  // Computed on the host once per model, then where the rotations run.
  table.cos = device_copy(cos);
  table.sin = device_copy(sin);
  return table;
}

}  // namespace moecore
