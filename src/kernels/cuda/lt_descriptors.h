// cuBLASLt's descriptors as the backend's GEMMs make them (gemm_lt.cpp keeps them per problem,
// mx_gemm_block_scaled.cpp makes them per call). Host code only.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda::lt {

// The operation: fp32 compute and scale type; attributes set one by one.
class MatmulDesc {
 public:
  MatmulDesc() {
    MOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc_); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attribute, T value) {
    MOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attribute, &value, sizeof(value)));
  }
  cublasLtMatmulDesc_t get() const { return desc_; }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
};

// A column-major rows x cols matrix with leading dimension rows (contiguous).
class Layout {
 public:
  Layout(cudaDataType_t type, int64_t rows, int64_t cols) {
    MOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_, type, static_cast<uint64_t>(rows),
                                                static_cast<uint64_t>(cols), rows));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(layout_); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

class Preference {
 public:
  Preference() { MOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference_)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(preference_); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, T value) {
    MOE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(preference_, attribute, &value, sizeof(value)));
  }
  cublasLtMatmulPreference_t get() const { return preference_; }

 private:
  cublasLtMatmulPreference_t preference_ = nullptr;
};

// The largest power of two up to 256 that divides the address: cuBLASLt's heuristic assumes 256
// unless told, and an operand that starts inside a buffer (an expert's rows) may be less aligned.
inline uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace moecore::kernels::cuda::lt
