// The compute primitives of moecore, on tensor views. One declaration per operation; the backend
// that defines them is chosen at build time (kernels/cpu/ now, kernels/cuda/ next), and
// kernels/reference/ holds a plain-loop oracle of each under kernels::reference with the same
// signature (the per-op harness, tests/cpp/test_kernel_ops.cpp, compares every backend with it).
// Model code composes these and holds no compute loop of its own.
//
// Views are contiguous f32 (i32 for token ids and targets) unless an operation says otherwise;
// a kernel checks shapes and dtypes and names itself in the error. Gradient rules
// (model/grad_rules.h): parameter gradients accumulate (+=), activation gradients overwrite (=)
// unless a flag says otherwise.
#pragma once

#include <cstdint>

#include "core/ignore_index.h"
#include "core/tensor_view.h"
#include "kernels/gemm.h"

namespace moecore {

struct CrossEntropyResult {
  double loss;  // mean over counted tokens (or over `normalizer`)
  int64_t counted_tokens;
};

// The scalars of one AdamW update of a range of elements (torch.optim.AdamW's formula):
//   g *= grad_scale; p *= decay_factor; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//   p -= step_size * m / (sqrt(v) / bias2_sqrt + eps)
// with step_size = lr / (1 - b1^t), bias2_sqrt = sqrt(1 - b2^t), decay_factor = 1 - lr wd.
struct AdamWCoefficients {
  float decay_factor, b1, b2, bias2_sqrt, eps, step_size, grad_scale;
};

}  // namespace moecore

// Every declaration twice from one list: kernels:: is the backend compiled in, and
// kernels::reference:: the oracle.
namespace moecore::kernels {
#include "kernels/op_declarations.inc"
}  // namespace moecore::kernels

namespace moecore::kernels::reference {
#include "kernels/op_declarations.inc"
}  // namespace moecore::kernels::reference
