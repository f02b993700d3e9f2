#include "dist/device_communicators.h"

#include <array>
#include <atomic>

#include "core/check.h"

namespace moecore::dist {

namespace {

std::array<std::atomic<const DeviceCommunicatorFactory*>, kDeviceCount>& registered() {
  static std::array<std::atomic<const DeviceCommunicatorFactory*>, kDeviceCount> factories{};
  return factories;
}

}  // namespace

void register_device_communicator(Device device, const DeviceCommunicatorFactory* factory) {
  MOE_CHECK(device != Device::kCpu,
            "[dist] host memory is MPI's; register a communicator for a device's memory");
  registered()[static_cast<size_t>(device)].store(factory, std::memory_order_release);
}

const DeviceCommunicatorFactory* device_communicator(Device device) {
  if (device == Device::kCpu) return nullptr;
  return registered()[static_cast<size_t>(device)].load(std::memory_order_acquire);
}

}  // namespace moecore::dist
