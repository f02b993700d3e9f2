// A non-owning view of a tensor: pointer, shape, strides (in elements), dtype and device. Kernels
// take views instead of raw pointers so that one declaration serves every backend (the CPU now,
// CUDA next) and each kernel can check what it is handed. ConstTensorView reads, TensorView also
// writes; a TensorView converts to a ConstTensorView, never the reverse.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/check.h"
#include "core/device.h"
#include "core/device_memory.h"
#include "core/dtype.h"

namespace moecore {

inline constexpr int kMaxTensorRank = 4;

template <bool kMutable>
class BasicTensorView {
 public:
  using Pointer = std::conditional_t<kMutable, void*, const void*>;

  BasicTensorView() = default;
  // A row-major (contiguous) view; shape has at most kMaxTensorRank extents. Its device is that of
  // the memory `data` points into (core/device_memory.h's device_of) unless given.
  BasicTensorView(Pointer data, std::initializer_list<int64_t> shape, DType dtype)
      : BasicTensorView(data, shape, dtype, device_of(data)) {}
  BasicTensorView(Pointer data, std::initializer_list<int64_t> shape, DType dtype, Device device)
      : data_(data), rank_(static_cast<int>(shape.size())), dtype_(dtype), device_(device) {
    MOE_CHECK(rank_ <= kMaxTensorRank, "[tensor_view] rank {} exceeds the maximum {}", rank_,
              kMaxTensorRank);
    int d = 0;
    for (const int64_t extent : shape) {
      MOE_CHECK(extent >= 0, "[tensor_view] negative extent {}", extent);
      shape_[d++] = extent;
    }
    int64_t stride = 1;
    for (d = rank_ - 1; d >= 0; --d) {
      strides_[d] = stride;
      stride *= shape_[d];
    }
  }

  // A mutable view reads as a const one.
  template <bool kOther>
  requires(kOther && !kMutable)
      BasicTensorView(const BasicTensorView<kOther>& other)  // NOLINT: implicit on purpose
      : data_(other.raw()),
        shape_(other.shape()),
        strides_(other.strides()),
        rank_(other.rank()),
        dtype_(other.dtype()),
        device_(other.device()) {}

  Pointer raw() const { return data_; }
  // The same shape, strides and dtype at another address: a copy of the tensor elsewhere (its
  // device copy, say).
  BasicTensorView relocated(Pointer data, Device device) const {
    BasicTensorView moved = *this;
    moved.data_ = data;
    moved.device_ = device;
    return moved;
  }
  int rank() const { return rank_; }
  int64_t size(int dim) const { return shape_[dim]; }
  int64_t stride(int dim) const { return strides_[dim]; }
  const std::array<int64_t, kMaxTensorRank>& shape() const { return shape_; }
  const std::array<int64_t, kMaxTensorRank>& strides() const { return strides_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank_; ++d) n *= shape_[d];
    return n;
  }

  bool is_contiguous() const {
    int64_t expected = 1;
    for (int d = rank_ - 1; d >= 0; --d) {
      if (shape_[d] != 1 && strides_[d] != expected) return false;
      expected *= shape_[d];
    }
    return true;
  }

  // The typed pointer; the dtype must be T's (a kernel asking for floats from a bf16 view is a
  // bug that names the kernel).
  template <typename T>
  std::conditional_t<kMutable, T*, const T*> data(const char* op) const {
    MOE_CHECK(dtype_ == dtype_of<T>(), "[{}] expected a {} tensor, got {}", op,
              dtype_name(dtype_of<T>()), dtype_name(dtype_));
    return static_cast<std::conditional_t<kMutable, T*, const T*>>(data_);
  }

 private:
  Pointer data_ = nullptr;
  std::array<int64_t, kMaxTensorRank> shape_{};
  std::array<int64_t, kMaxTensorRank> strides_{};
  int rank_ = 0;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
};

using TensorView = BasicTensorView<true>;
using ConstTensorView = BasicTensorView<false>;

// Contiguous views of typed buffers, the common case of the model code (on the device whose memory
// holds `data`, as every view made without naming one).
inline TensorView view(float* data, std::initializer_list<int64_t> shape) {
  return {data, shape, DType::kF32};
}
inline ConstTensorView view(const float* data, std::initializer_list<int64_t> shape) {
  return {data, shape, DType::kF32};
}
inline TensorView view(int32_t* data, std::initializer_list<int64_t> shape) {
  return {data, shape, DType::kI32};
}
inline ConstTensorView view(const int32_t* data, std::initializer_list<int64_t> shape) {
  return {data, shape, DType::kI32};
}
inline TensorView view(int64_t* data, std::initializer_list<int64_t> shape) {
  return {data, shape, DType::kI64};
}
inline ConstTensorView view(const int64_t* data, std::initializer_list<int64_t> shape) {
  return {data, shape, DType::kI64};
}
inline TensorView view(double* data, std::initializer_list<int64_t> shape) {
  return {data, shape, DType::kF64};
}
inline ConstTensorView view(const double* data, std::initializer_list<int64_t> shape) {
  return {data, shape, DType::kF64};
}

}  // namespace moecore
