// A device's work captured into a graph and replayed (a CUDA graph on the CUDA backend): what
// train.cuda_graph issues a training step with, one launch instead of thousands, and no host in
// between. A backend registers its DeviceGraphs when the process selects its device, as it does
// its memory (core/device_memory.h). While a capture is open the device runs nothing: every
// operation given to it is recorded with the arguments it was given, and a replay runs them again
// on the same buffers with those arguments. So what changes from one replay to the next must
// reach the operations through device memory written before the replay, and a captured step must
// neither copy between host and device nor allocate (the backend refuses both in one line).
#pragma once

#include <cstdint>
#include <memory>

#include "core/device.h"

namespace moecore {

// Captured work, replayed as often as wanted while every buffer it uses lives.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void replay() = 0;
};

class DeviceGraphs {
 public:
  virtual ~DeviceGraphs() = default;
  // Opens a capture of the device's work on this thread.
  virtual void begin_capture() = 0;
  // Closes it and returns what it recorded; throws moecore::Error naming what broke it.
  virtual std::unique_ptr<DeviceGraph> end_capture() = 0;
  // Closes a capture that an exception left open, discarding it.
  virtual void abandon_capture() noexcept = 0;
};

// Makes `graphs` capture `device`'s work (nullptr: none does).
void register_device_graphs(Device device, DeviceGraphs* graphs);
// The device's, or nullptr where its backend has none (the CPU's: nothing to capture).
DeviceGraphs* device_graphs(Device device);

// How many allocations of device memory have been freed in this process so far: a graph is valid
// while none of its buffers is freed, which a caller that keeps this count at the capture can
// rule out cheaply (no free since: valid).
uint64_t device_frees();

}  // namespace moecore
