// The CPU backend's operations: kernels/op_declarations.inc's declarations once more, in
// kernels::cpu, on host views (oneDNN GEMMs and OpenMP loops). kernels::* (kernels/ops.h) reaches
// them through kernels/device_dispatch.cpp for views in host memory; the per-op harness reaches
// them through cpu_backend().
#pragma once

#include "kernels/ops.h"

namespace moecore::kernels::cpu {
#include "kernels/op_declarations.inc"
}  // namespace moecore::kernels::cpu
