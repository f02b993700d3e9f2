// The argument checks of the elementwise kernels, shared by every backend: equal extents.
#pragma once

#include "kernels/view_checks.h"

namespace moecore::kernels {

template <bool kMutable>
void expect_same_extents(const char* op, const char* name, const BasicTensorView<kMutable>& v,
                         ConstTensorView like) {
  MOE_CHECK(v.numel() == like.numel(), "[{}] {} has {} elements, expected {}", op, name, v.numel(),
            like.numel());
  MOE_CHECK(v.is_contiguous(), "[{}] {} must be contiguous", op, name);
  MOE_CHECK(v.device() == like.device(), "[{}] {} is on another device", op, name);
}

}  // namespace moecore::kernels
