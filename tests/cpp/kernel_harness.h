// The per-op backend harness, in the style of ggml's test-backend-ops: every kernel of
// kernels/ops.h runs on random inputs of several shapes (odd sizes included, so that SIMD tails
// and thread splits are exercised) in every registered backend and is compared with the
// plain-loop oracle (kernels::reference) by normalised error; backward kernels are also checked
// against central differences of the same backend's forward.
//
// A backend joins by registering its table once (kernel_backend_cpu.cpp is the CPU's):
//   static const kernel_harness::BackendRegistration kRegistration{kernels::cuda_backend()};
// and then gets every case of test_kernel_ops.cpp and test_kernel_ops_mx.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor_view.h"
#include "kernels/backend.h"

namespace moecore::kernel_harness {

// The grouped GEMMs' expert_offsets tensor ([E + 1] i64) over a host vector of them.
inline ConstTensorView offsets_view(const std::vector<int64_t>& offsets) {
  return view(offsets.data(), {static_cast<int64_t>(offsets.size())});
}

// The plain-loop backend (kernels/reference/) every backend's results are compared with.
inline const kernels::KernelBackend& oracle() {
  return kernels::reference_backend();
}

// INSTANTIATE_TEST_SUITE_P's name generator: a case is named by its backend (KernelOps/...cpu).
inline std::string backend_name(
    const ::testing::TestParamInfo<const kernels::KernelBackend*>& info) {
  return std::string(info.param->name);
}

inline std::vector<const kernels::KernelBackend*>& registered_backends() {
  static std::vector<const kernels::KernelBackend*> backends;
  return backends;
}

struct BackendRegistration {
  explicit BackendRegistration(const kernels::KernelBackend& backend) {
    registered_backends().push_back(&backend);
  }
};

// A backend that is still being written leaves the ops it lacks null in its table (the CUDA
// backend, kernels/cuda/ops.h); the cases that run them are skipped there, naming the ops. The
// CPU backend's table is complete, so nothing skips on it.
template <typename... Ops>
bool implemented(Ops... ops) {
  return ((ops != nullptr) && ...);
}
// The first statement of a TEST_P whose fixture has backend():
//   MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().rope_forward, backend().rope_backward);
#define MOECORE_SKIP_UNLESS_IMPLEMENTED(...)                \
  if (!::moecore::kernel_harness::implemented(__VA_ARGS__)) \
  GTEST_SKIP() << backend().name << " does not implement every op of: " << #__VA_ARGS__

// ggml's normalised mean squared error: sum (got - ref)^2 / sum ref^2 (0 when both are 0).
inline double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double diff = static_cast<double>(got[i]) - static_cast<double>(ref[i]);
    err += diff * diff;
    norm += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return norm > 0.0 ? err / norm : err;
}

// The NMSE bound of an fp32 result whose elements each come out of reductions of at most
// `reduction_length` terms, against a reference in double. Derived (tests/TOLERANCES.md): an
// fp32 sum of n terms is within n u sum|t| of the exact sum (u = 2^-24), and sum|t| <= sqrt(n)
// ||t||_2, while a sum of n independent random terms has magnitude ~ ||t||_2; so the relative
// error per element is at most ~ n^1.5 u, and its square bounds the NMSE. A factor 4 on the error
// (16 on the NMSE) covers the few roundings after the reduction (a sqrt, an exp within 2 ulp, a
// product). A wrong kernel (an index off by one, a missing term) gives NMSE ~ 1e-2 .. 1.
inline double nmse_bound(int64_t reduction_length) {
  const double u = std::ldexp(1.0, -24);
  const double n = static_cast<double>(std::max<int64_t>(reduction_length, 1)) + 8.0;
  return 16.0 * n * n * n * u * u;
}

}  // namespace moecore::kernel_harness
