// mx::ElemType and mx::ScaleMode as the MX launchers take them (launchers.h mirrors them for
// nvcc, which does not compile core/mx_types.h's callers here). Host code only.
#pragma once

#include "core/mx_types.h"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {

inline MxElem device_elem(mx::ElemType elem) {
  return elem == mx::ElemType::kE4M3 ? MxElem::kE4M3 : MxElem::kE5M2;
}

inline MxScaleRule device_scale_rule(mx::ScaleMode mode) {
  return mode == mx::ScaleMode::kRceil ? MxScaleRule::kRceil : MxScaleRule::kFloor;
}

}  // namespace moecore::kernels::cuda
