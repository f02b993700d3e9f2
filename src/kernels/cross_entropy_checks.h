// The argument check of cross_entropy's normalizer, shared by every backend.
#pragma once

#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels {

// A given normalizer is f64 [1].
inline void expect_normalizer(const char* op, ConstTensorView normalizer,
                              Device device = Device::kCpu) {
  if (!view_given(normalizer)) return;
  expect_shape(op, "normalizer", normalizer, {1}, device);
  MOE_CHECK(normalizer.dtype() == DType::kF64, "[{}] normalizer must be f64, got {}", op,
            dtype_name(normalizer.dtype()));
}

}  // namespace moecore::kernels
