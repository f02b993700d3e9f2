// The CUDA backend's argument checks: every view it is handed is in device memory, or absent (an
// optional operand not given: a default view, whose rank 0 makes one element of nothing at a
// null address in host memory, or an empty one).
#pragma once

#include "core/check.h"
#include "core/tensor_view.h"

namespace moecore::kernels::cuda {

template <bool kMutable>
void expect_on_device(const char* op, const char* name, const BasicTensorView<kMutable>& v) {
  MOE_CHECK(v.device() == Device::kCuda || v.raw() == nullptr || v.numel() == 0,
            "[{}] {} is in host memory: the CUDA backend takes device views", op, name);
}

}  // namespace moecore::kernels::cuda
