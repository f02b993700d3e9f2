#include "dist/nccl/nccl_registration.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/fnv1a.h"
#include "dist/device_communicators.h"
#include "dist/nccl/nccl_check.h"
#include "dist/nccl/nccl_communicator.h"

namespace moecore::dist::nccl {

namespace {

std::unique_ptr<Communicator> create(const Communicator& bootstrap, const std::string& group) {
  return NcclCommunicator::create(bootstrap, group);
}

// This process's GPU, the same number for every process on it: FNV-1a of the device's UUID.
int64_t device_key(const std::string& group) {
  int device = 0;
  MOE_NCCL_CHECK(cudaGetDevice(&device), nullptr, group);
  cudaDeviceProp properties{};
  MOE_NCCL_CHECK(cudaGetDeviceProperties(&properties, device), nullptr, group);
  return static_cast<int64_t>(fnv1a(std::as_bytes(std::span(properties.uuid.bytes))));
}

// NCCL refuses two ranks of one communicator on one device (ncclCommInitRank fails, or hangs):
// say so before, naming the first two ranks that share one.
std::string unusable(const Communicator& bootstrap) {
  if (bootstrap.size() == 1) return "";
  const int64_t mine = device_key(bootstrap.name());
  std::vector<int64_t> keys(static_cast<size_t>(bootstrap.size()));
  bootstrap.allgather(&mine, keys.data(), 1);
  for (size_t a = 0; a < keys.size(); ++a)
    for (size_t b = a + 1; b < keys.size(); ++b)
      if (keys[a] == keys[b])
        return fmt::format("ranks {} and {} share one GPU, and NCCL takes one rank per device", a,
                           b);
  return "";
}

constexpr DeviceCommunicatorFactory kFactory{
    .name = "nccl", .create = &create, .unusable = &unusable};

}  // namespace

std::string describe_library() {
  // NCCL's version codes since 2.9: major * 10000 + minor * 100 + patch.
  const auto dotted = [](int code) {
    return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  };
  int loaded = 0;
  MOE_NCCL_CHECK(ncclGetVersion(&loaded), nullptr, "");
  std::string line =
      fmt::format("NCCL {} loaded, built against {}", dotted(loaded), dotted(NCCL_VERSION_CODE));
  if (loaded != NCCL_VERSION_CODE)
    line +=
        " (they differ: parallel.rowwise_transport=\"symmetric\" refuses to run, its tests skip)";
  return line;
}

void register_communicator() {
  register_device_communicator(Device::kCuda, &kFactory);
}

}  // namespace moecore::dist::nccl
