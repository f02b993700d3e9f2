// The operand precision of the model's GEMMs, process-wide (like torch.autocast): kFp32 multiplies
// fp32 operands; kBf16 rounds both operands to bf16 and accumulates in fp32 (outputs stay fp32).
// Weights, gradients, optimizer state and everything outside the GEMMs stay fp32 either way, and
// GEMMs that must stay fp32 whatever the setting (the router's) call kernels::gemm_fp32.
// The trainer sets it once per run from train.precision through MatmulPrecisionScope.
#pragma once

#include <atomic>

namespace moecore::kernels {

enum class MatmulPrecision { kFp32, kBf16 };

namespace detail {
// Read by every GEMM, possibly from many threads; written only between steps.
inline std::atomic<MatmulPrecision> g_matmul_precision{MatmulPrecision::kFp32};
}  // namespace detail

inline MatmulPrecision matmul_precision() {
  return detail::g_matmul_precision.load(std::memory_order_relaxed);
}

// Sets the precision for its lifetime and restores the previous one (also on an exception).
class MatmulPrecisionScope {
 public:
  explicit MatmulPrecisionScope(MatmulPrecision precision)
      : previous_(detail::g_matmul_precision.exchange(precision)) {}
  ~MatmulPrecisionScope() { detail::g_matmul_precision.store(previous_); }
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;

 private:
  MatmulPrecision previous_;
};

}  // namespace moecore::kernels
