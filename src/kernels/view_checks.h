// Argument checks shared by every backend's kernels: a view has the shape the operation needs and
// is contiguous on the device the backend runs on. Errors name the operation and the argument.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/check.h"
#include "core/tensor_view.h"

namespace moecore::kernels {

template <bool kMutable>
void expect_shape(const char* op, const char* name, const BasicTensorView<kMutable>& v,
                  std::initializer_list<int64_t> shape, Device device = Device::kCpu) {
  MOE_CHECK(v.rank() == static_cast<int>(shape.size()), "[{}] {} has rank {}, expected {}", op,
            name, v.rank(), shape.size());
  int d = 0;
  for (const int64_t extent : shape) {
    MOE_CHECK(v.size(d) == extent, "[{}] {} has extent {} in dimension {}, expected {}", op, name,
              v.size(d), d, extent);
    ++d;
  }
  MOE_CHECK(v.is_contiguous(), "[{}] {} must be contiguous", op, name);
  MOE_CHECK(v.device() == device, "[{}] {} is on another device than the kernel", op, name);
  MOE_CHECK(v.numel() == 0 || v.raw() != nullptr, "[{}] {} has no data", op, name);
}

}  // namespace moecore::kernels
