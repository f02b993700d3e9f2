// Element types a tensor view can hold. f32 and bf16 carry model data today; e4m3, e5m2 (FP8
// elements) and e8m0 (the shared power-of-two scale of an MX block) are reserved for MXFP8, whose
// conversions live in core/mx_*.h. i32 holds token ids, targets and expert indices; i64 holds row
// offsets and counts (an MoE layer's expert offsets); f64 holds the statistics the losses sum in
// double (the router's column sums and z-loss).
#pragma once

#include <cstddef>
#include <cstdint>

namespace moecore {

enum class DType : uint8_t { kF32, kBf16, kE4m3, kE5m2, kE8m0, kI32, kI64, kF64 };

constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kI64:
    case DType::kF64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBf16:
      return 2;
    case DType::kE4m3:
    case DType::kE5m2:
    case DType::kE8m0:
      return 1;
  }
  return 0;
}

constexpr const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBf16:
      return "bf16";
    case DType::kE4m3:
      return "e4m3";
    case DType::kE5m2:
      return "e5m2";
    case DType::kE8m0:
      return "e8m0";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kF64:
      return "f64";
  }
  return "?";
}

// The C++ type that holds one element of a dtype, for the typed accessors of a view. Only types
// with a native representation have one; bf16 and the FP8 codes are read through their own
// conversion headers.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kF64;
}

}  // namespace moecore
