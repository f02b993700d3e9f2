// The CPU backend joins the per-op harness (kernel_harness.h).
#include "kernel_harness.h"

namespace moecore::kernel_harness {
namespace {

const BackendRegistration kCpuRegistration{kernels::cpu_backend()};

}  // namespace
}  // namespace moecore::kernel_harness
