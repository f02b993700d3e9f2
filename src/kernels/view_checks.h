// Argument checks shared by every backend's kernels: a view has the shape the operation needs and
// is contiguous on the device the backend runs on. Errors name the operation and the argument.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/check.h"
#include "core/tensor_view.h"
#include "kernels/matmul_precision.h"

namespace moecore::kernels {

// Whether an optional operand is given: an empty view (TensorView(), ConstTensorView()) is not.
inline bool view_given(ConstTensorView v) {
  return v.raw() != nullptr && v.numel() > 0;
}

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
  // An empty view (an absent operand, a buffer of no rows) has no memory to be on: a rank whose
  // experts received no rows passes such views beside device ones.
  MOE_CHECK(v.numel() == 0 || v.device() == device, "[{}] {} is on another device than the kernel",
            op, name);
  MOE_CHECK(v.numel() == 0 || v.raw() != nullptr, "[{}] {} has no data", op, name);
}

// A GEMM's weight operand is f32, or bf16 bits (a copy made once per optimizer step) when the
// GEMM multiplies in bf16; a bf16 weight in an fp32 GEMM would silently lose precision.
inline void expect_weight_dtype(const char* op, const char* name, ConstTensorView w,
                                MatmulPrecision precision) {
  MOE_CHECK(w.dtype() == DType::kF32 ||
                (w.dtype() == DType::kBf16 && precision == MatmulPrecision::kBf16),
            "[{}] {} is {}: a weight operand is f32, or bf16 in a bf16 GEMM", op, name,
            dtype_name(w.dtype()));
}

// A GEMM's activation operand is f32, or bf16 bits (rounded once for the several GEMMs that read
// it, or written in bf16 by the operation that made it) when the GEMM multiplies in bf16.
inline void expect_activation_dtype(const char* op, const char* name, ConstTensorView a,
                                    MatmulPrecision precision) {
  MOE_CHECK(a.dtype() == DType::kF32 ||
                (a.dtype() == DType::kBf16 && precision == MatmulPrecision::kBf16),
            "[{}] {} is {}: an activation operand is f32, or bf16 in a bf16 GEMM", op, name,
            dtype_name(a.dtype()));
}

// An element-wise operation's output is f32, or bf16 (each value rounded to nearest even as
// core/bf16.h's float_to_bf16) where only bf16 GEMMs read it.
template <bool kMutable>
void expect_f32_or_bf16(const char* op, const char* name, const BasicTensorView<kMutable>& v) {
  MOE_CHECK(v.dtype() == DType::kF32 || v.dtype() == DType::kBf16, "[{}] {} is {}: f32 or bf16", op,
            name, dtype_name(v.dtype()));
}

// The bits of a bf16 view (core/bf16.h converts them).
inline const uint16_t* bf16_bits(const char* op, ConstTensorView v) {
  MOE_CHECK(v.dtype() == DType::kBf16, "[{}] expected a bf16 tensor, got {}", op,
            dtype_name(v.dtype()));
  return static_cast<const uint16_t*>(v.raw());
}
inline uint16_t* bf16_bits(const char* op, TensorView v) {
  MOE_CHECK(v.dtype() == DType::kBf16, "[{}] expected a bf16 tensor, got {}", op,
            dtype_name(v.dtype()));
  return static_cast<uint16_t*>(v.raw());
}

}  // namespace moecore::kernels
