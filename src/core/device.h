// Where a tensor's memory is: the host (Device::kCpu) or a GPU's (Device::kCuda).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moecore {

enum class Device : uint8_t { kCpu, kCuda };
inline constexpr size_t kDeviceCount = 2;

// "cpu" or "cuda", for messages.
constexpr std::string_view device_name(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "unknown";
}

}  // namespace moecore
