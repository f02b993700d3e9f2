#include "core/device_graph.h"

#include <array>
#include <atomic>
#include <cstddef>

namespace moecore {

namespace {

std::array<std::atomic<DeviceGraphs*>, kDeviceCount>& registered_graphs() {
  static std::array<std::atomic<DeviceGraphs*>, kDeviceCount> graphs{};
  return graphs;
}

}  // namespace

void register_device_graphs(Device device, DeviceGraphs* graphs) {
  registered_graphs()[static_cast<size_t>(device)].store(graphs);
}

DeviceGraphs* device_graphs(Device device) {
  return registered_graphs()[static_cast<size_t>(device)].load();
}

}  // namespace moecore
